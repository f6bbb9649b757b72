"""Loading and checking settings: every error names the key path and the problem."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml

from gateway.catalog import builtin_catalog
from gateway.ceilings import MAX_AMOUNT
from gateway.config._credentials import AwsCredentials, credential_refs
from gateway.config._models import ModelFigures, check_output_caps, resolve_models
from gateway.config._ranges import PRICE_FIELDS
from gateway.config._routing import check_soft_tier
from gateway.config._settings import Deployment, ModelSettings, ProviderSettings, Settings
from gateway.errors import ConfigError
from gateway.pricing import ModelPrice

DEFAULT_MOCK_MODELS = ("mock-gpt", "mock-claude")
T = TypeVar("T")


def resolve_secret(ref: str, *, key: str) -> str:
    """Resolve ``env:NAME`` or ``file:PATH``; ``key`` is the config path for errors."""
    if ref.startswith("env:"):
        name = ref[4:]
        value = os.environ.get(name)
        if value is None:
            raise ConfigError(f"{key}: environment variable {name} is not set")
        return value
    if ref.startswith("file:"):
        path = Path(ref[5:]).expanduser()
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{key}: cannot read {path}: {exc.strerror}") from exc
    raise ConfigError(f"{key}: secrets must be references (env:NAME or file:PATH), "
                      "never inline values")


def is_reference(value: str) -> bool:
    """``env:NAME`` or ``file:PATH``: safe to print (an inline value never is)."""
    return value.startswith(("env:", "file:"))


def secret_refs(settings: Settings) -> list[tuple[str, str]]:
    """Every secret reference the gateway resolves at startup, as (key path, reference)."""
    s = settings.server
    refs = [("server.admin_token_ref", s.admin_token_ref),
            ("server.metrics_token_ref", s.metrics_token_ref),
            ("server.alerts.secret_ref", s.alerts.secret_ref)]
    refs += [(f"server.admin_tokens[{i}].token_ref", t.token_ref)
             for i, t in enumerate(s.admin_tokens)]
    refs.append(("server.rotation_secret_ref", s.rotation_secret_ref))
    refs += [(f"server.rotation_secret_previous_refs[{i}]", r)
             for i, r in enumerate(s.rotation_secret_previous_refs)]
    if settings.shared and settings.database is not None:
        refs.append(("database.dsn_ref", settings.database.dsn_ref))
    refs += [(f"providers[{i}].api_key_ref", p.api_key_ref)
             for i, p in enumerate(settings.providers)]
    refs += [r for i, p in enumerate(settings.providers)
             for r in credential_refs(f"providers[{i}]", p.credentials)]
    if settings.control_plane is not None:
        refs.append(("control_plane.token_ref", settings.control_plane.token_ref))
    issuers = settings.identity.issuers if settings.identity is not None else []
    refs += [(f"identity.issuers[{i}].roles.console.client_secret_ref",
              x.roles.console.client_secret_ref) for i, x in enumerate(issuers)
             if x.roles is not None and x.roles.console is not None]
    if settings.telemetry is not None:
        refs += [(f"telemetry.header_refs.{name}", ref)
                 for name, ref in settings.telemetry.header_refs.items()]
    return [(key, ref) for key, ref in refs if ref is not None]


def check_secrets(settings: Settings) -> None:
    """Resolve every secret reference now, so a bad one fails before anything starts;
    the error names the key and the reference's source, never a value."""
    for key, ref in secret_refs(settings):
        resolve_secret(ref, key=key)


def _with_defaults(settings: Settings) -> Settings:
    """With no provider configured, the built-in mock serves demo models offline."""
    if settings.providers or settings.models:
        return settings
    price = ModelPrice(input=1_000_000, output=4_000_000, cache_read=100_000,
                       cache_write_5m=1_250_000, cache_write_1h=2_000_000)
    return msgspec.structs.replace(
        settings,
        providers=[ProviderSettings(name="mock", kind="mock")],
        models=[ModelSettings(name=m, deployments=[Deployment(provider="mock")], price=price,
                              max_input_tokens=200_000)
                for m in DEFAULT_MOCK_MODELS])


def _check(settings: Settings) -> None:
    names = [p.name for p in settings.providers]
    for i, p in enumerate(settings.providers):
        if p.name in names[:i]:  # name the repeat, not the first (legitimate) one
            raise ConfigError(f"providers[{i}].name: duplicate provider {p.name!r} "
                              f"(first at providers[{names.index(p.name)}])")
        if p.kind in ("openai", "anthropic") and not p.base_url:
            raise ConfigError(f"providers[{i}].base_url: required for kind {p.kind}")
        if p.kind == "bedrock" and not isinstance(p.credentials, AwsCredentials):
            raise ConfigError(f"providers[{i}].credentials: kind bedrock needs "
                              "{kind: aws, region: ...}")
    for i, m in enumerate(settings.models):
        if not m.deployments:
            raise ConfigError(f"models[{i}].deployments: at least one deployment is required")
        for j, d in enumerate(m.deployments):
            if d.provider not in names:
                raise ConfigError(f"models[{i}].deployments[{j}].provider: unknown provider "
                                  f"{d.provider!r} (known: {', '.join(names) or 'none'})")
        _check_price(f"models[{i}]", m)
        if (wrong := check_soft_tier(f"models[{i}]", m)) is not None:
            raise ConfigError(wrong)
    check_output_caps(settings)
    if settings.policies is not None and settings.control_plane is not None:
        raise ConfigError("policies: mutually exclusive with control_plane "
                          "(one authoritative policy source)")
    if settings.control_plane is not None and settings.governance_store.type != "local":
        # Leases bound LOCAL counters; the shared profile's authority is the database.
        raise ConfigError("control_plane: the lease profile needs governance_store.type: "
                          "local (the shared profile takes its policies and budgets from "
                          "the database, not from leases)")
    if settings.control_plane is not None and settings.server.workers > 1:
        raise ConfigError(f"server.workers: the lease profile runs one process per node "
                          f"(its leases are the node's share of a budget), not "
                          f"{settings.server.workers}; set 1")
    ks, gs = settings.key_store.type, settings.governance_store.type
    if (ks == "postgres") != (gs == "postgres"):
        raise ConfigError("governance_store.type: shared mode needs key_store.type: postgres "
                          "and governance_store.type: postgres together")
    if settings.shared:
        if settings.governance_store.journal:
            raise ConfigError("governance_store.journal: shared mode refuses a local journal "
                              "(Postgres is the only authority; ADR-046)")
        if settings.database is None:
            raise ConfigError("database: required when key_store/governance_store are postgres")
    _check_alerts(settings)
    _check_proxies(settings)
    db = settings.database
    if db is not None and db.pool_min_size > db.pool_max_size:
        raise ConfigError(f"database.pool_min_size: {db.pool_min_size} is above "
                          f"database.pool_max_size ({db.pool_max_size})")


def _check_alerts(settings: Settings) -> None:
    alerts = settings.server.alerts
    if alerts.webhook_url is None:
        return
    if not alerts.webhook_url.startswith(("http://", "https://")):
        raise ConfigError("server.alerts.webhook_url: must be an http:// or https:// URL")
    if alerts.secret_ref is None:
        raise ConfigError("server.alerts.secret_ref: required with webhook_url (the "
                          "receiver verifies each event's x-inferplane-signature with it)")


def _check_proxies(settings: Settings) -> None:
    for i, proxy in enumerate(settings.server.trusted_proxies):
        try:
            ipaddress.ip_network(proxy, strict=False)
        except ValueError:
            raise ConfigError(f"server.trusted_proxies[{i}]: {proxy!r} is not an IP address "
                              "or network (10.0.0.5, 10.0.0.0/8, fd00::/8)") from None


def _check_price(where: str, m: ModelSettings) -> None:
    """Prices within the money ceiling, and a default bound the planner will accept.

    (Token counts and every other number have msgspec ranges in ``_settings``.)
    """
    for cls in PRICE_FIELDS:
        value = m.price.per_class(cls)
        if not 0 <= value <= MAX_AMOUNT:
            raise ConfigError(f"{where}.price.{cls}: must be an integer in 0..{MAX_AMOUNT} "
                              f"(µUSD per million tokens), got {value}")
    # A request that sets no max_tokens is bounded by max_output_tokens; if that bound
    # alone exceeds what one charge may carry, every such request would be refused.
    out = -(-m.max_output_tokens * m.price.output // 1_000_000)
    if out > MAX_AMOUNT:
        raise ConfigError(f"{where}.max_output_tokens: {m.max_output_tokens} tokens at "
                          f"price.output {m.price.output} is a {out} µUSD bound, above the "
                          f"largest admissible amount {MAX_AMOUNT}")


def decode_yaml_file(path: str | os.PathLike[str], type_: type[T]) -> T:
    """Read a YAML file and decode it into ``type_``.

    Every failure is a :class:`ConfigError` that starts with the file name; a decoding
    error then leads with the bad key's path (``listen.port: Expected `int` ...``).
    An empty file decodes as an empty mapping, so every field takes its default.
    """
    return _decode(_read_yaml(path), type_, path)


def _read_yaml(path: str | os.PathLike[str]) -> Any:
    try:
        return yaml.safe_load(Path(path).read_bytes().decode("utf-8")) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (byte {exc.start})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    except RecursionError as exc:  # a config is a few levels deep; this is not one
        raise ConfigError(f"{path}: nested too deeply to be a config file") from exc


def _decode(raw: Any, type_: type[T], path: str | os.PathLike[str]) -> T:
    try:
        return msgspec.convert(raw, type_)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {_path_first(str(exc))}") from exc


def load_settings(path: str | os.PathLike[str] | None) -> Settings:
    """Read, decode and check a config file (``None``: built-in local defaults)."""
    return load_settings_and_models(path)[0]


def load_settings_and_models(
        path: str | os.PathLike[str] | None) -> tuple[Settings, list[ModelFigures]]:
    """:func:`load_settings`, and every model in force with the source of each figure.

    Models that name a catalog model take its figures for the fields the file does not
    set (``gateway/config/_models.py``), before any check, so the checks see what serves.
    """
    raw = {} if path is None else _read_yaml(path)
    settings = Settings() if path is None else _decode(raw, Settings, path)
    settings = _with_defaults(settings)
    # An empty or absent list: the models (if any) are the built-in demo defaults.
    declared = raw.get("models") or None
    figures = resolve_models(settings.models, declared, catalog=builtin_catalog())
    settings = msgspec.structs.replace(settings, models=[f.model for f in figures])
    _check(settings)
    return settings, figures


def _path_first(message: str) -> str:
    """msgspec says '... - at `$.server.port`'; lead with the key path instead."""
    text, sep, where = message.rpartition(" - at `")
    if not sep:
        return message
    return f"{where.rstrip('`').removeprefix('$.')}: {text}"
