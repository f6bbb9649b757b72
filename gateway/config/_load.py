"""Loading and checking settings: every error names the key path and the problem."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import msgspec
import yaml

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
    for i, m in enumerate(settings.models):
        if not m.deployments:
            raise ConfigError(f"models[{i}].deployments: at least one deployment is required")
        for j, d in enumerate(m.deployments):
            if d.provider not in names:
                raise ConfigError(f"models[{i}].deployments[{j}].provider: unknown provider "
                                  f"{d.provider!r} (known: {', '.join(names) or 'none'})")
        for cls in ("input", "output", "cache_read", "cache_write_5m", "cache_write_1h"):
            if getattr(m.price, cls) < 0:
                raise ConfigError(f"models[{i}].price.{cls}: must not be negative")
        if m.max_output_tokens <= 0:
            raise ConfigError(f"models[{i}].max_output_tokens: must be positive")
        if m.input_overhead_tokens < 0:
            raise ConfigError(f"models[{i}].input_overhead_tokens: must not be negative")
        if m.max_input_tokens is not None and m.max_input_tokens <= 0:
            raise ConfigError(f"models[{i}].max_input_tokens: must be positive")
    if settings.policies is not None and settings.control_plane is not None:
        raise ConfigError("policies: mutually exclusive with control_plane "
                          "(one authoritative policy source)")
    if settings.control_plane is not None:
        # Refused rather than ignored: a gateway that silently runs ungoverned because
        # its policy source is not implemented is the worst failure mode (ADR-031).
        raise ConfigError("control_plane: the lease profile (policies and budget leases from "
                          "inferplaned, ADR-034) is not implemented in this version; use "
                          "policies: files (local) or the shared Postgres profile")
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
    if settings.server.max_body_bytes <= 0:
        raise ConfigError("server.max_body_bytes: must be positive")


def decode_yaml_file(path: str | os.PathLike[str], type_: type[T]) -> T:
    """Read a YAML file and decode it into ``type_``.

    Every failure is a :class:`ConfigError` that starts with the file name; a decoding
    error then leads with the bad key's path (``listen.port: Expected `int` ...``).
    An empty file decodes as an empty mapping, so every field takes its default.
    """
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return msgspec.convert(raw, type_)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {_path_first(str(exc))}") from exc


def load_settings(path: str | os.PathLike[str] | None) -> Settings:
    """Read, decode and check a config file (``None``: built-in local defaults)."""
    settings = Settings() if path is None else decode_yaml_file(path, Settings)
    settings = _with_defaults(settings)
    _check(settings)
    return settings


def _path_first(message: str) -> str:
    """msgspec says '... - at `$.server.port`'; lead with the key path instead."""
    text, sep, where = message.rpartition(" - at `")
    if not sep:
        return message
    return f"{where.rstrip('`').removeprefix('$.')}: {text}"
