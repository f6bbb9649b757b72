"""``mayu config check``: load a config the way the gateway would and summarise it.

A bad file exits 2 with the error naming the key path (``providers[0].base_url: …``), so
an operator finds a mistake before a deploy, not in a crash loop. Secret references are
checked for presence only; their values are never printed.
"""

from __future__ import annotations

import argparse
from typing import Any

from gateway.config import Settings, load_settings, resolve_secret
from gateway.errors import ConfigError
from gateway.pricing import CLASSES


def _profile(settings: Settings) -> str:
    if settings.shared:
        return "shared (Postgres key store and governance; N replicas)"
    if settings.control_plane is not None:
        return "lease (local stores bounded by control-plane leases)"
    return "local (SQLite key store and governance; exactly one replica)"


def _dollars(micros: int) -> str:
    whole, frac = divmod(micros, 1_000_000)
    return f"${whole}.{f'{frac:06d}'.rstrip('0').ljust(2, '0')}"


def _secret(ref: str | None, key: str) -> str:
    if ref is None:
        return "none"
    try:
        resolve_secret(ref, key=key)
    except ConfigError as exc:
        return f"{ref} (WARNING: {exc.message})"
    return f"{ref} (resolves)"


def _stores(settings: Settings) -> list[str]:
    default = f"{settings.data_dir}/mayu.db"
    lines = [f"data dir: {settings.data_dir}"]
    ks, gs = settings.key_store, settings.governance_store
    lines.append(f"key store: {ks.type}"
                 + (f" {ks.path or default}" if ks.type == "sqlite" else ""))
    lines.append(f"governance store: {gs.type}"
                 + (f" {gs.path or default}" if gs.type == "local" else ""))
    if settings.database is not None:
        lines.append("database: dsn " + _secret(settings.database.dsn_ref,
                                                 "database.dsn_ref")
                     + f", pool {settings.database.pool_min_size}.."
                       f"{settings.database.pool_max_size}")
    return lines


def _providers(settings: Settings) -> list[str]:
    lines = [f"providers ({len(settings.providers)}):"]
    for i, p in enumerate(settings.providers):
        where = f" {p.base_url}" if p.base_url else ""
        key = (f", api key {_secret(p.api_key_ref, f'providers[{i}].api_key_ref')}"
               if p.api_key_ref else "")
        lines.append(f"  {p.name}: {p.kind}{where}{key}")
    return lines


def _models(settings: Settings) -> list[str]:
    lines = [f"models ({len(settings.models)}):"]
    for m in settings.models:
        route = " -> ".join(d.provider + (f"/{d.upstream_model}" if d.upstream_model else "")
                            for d in m.deployments)
        prices = ", ".join(f"{c} {_dollars(m.price.per_class(c))}" for c in CLASSES)
        lines.append(f"  {m.name}: {route}; per Mtok: {prices}; "
                     f"max output {m.max_output_tokens}")
    return lines


def _policy(settings: Settings) -> list[str]:
    if settings.control_plane is not None:
        token = _secret(settings.control_plane.token_ref, "control_plane.token_ref")
        return [f"policies: control plane {settings.control_plane.url} (token {token})"]
    if settings.policies:
        return ["policies: files " + ", ".join(settings.policies)]
    return ["policies: none"]


def summary(settings: Settings) -> list[str]:
    s = settings.server
    lines = [f"profile: {_profile(settings)}",
             f"server: {s.host}:{s.port}, max body {s.max_body_bytes} bytes, "
             f"max output tokens {s.max_output_tokens}",
             *_stores(settings), *_providers(settings), *_models(settings),
             *_policy(settings)]
    if settings.bootstrap_teams:
        lines.append("bootstrap teams: " + ", ".join(t.name for t in settings.bootstrap_teams))
    lines.append("demo team on first run: " + ("yes" if settings.demo else "no"))
    return lines


def _check(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    print(f"config: {args.config or 'none (built-in local defaults)'}")
    for line in summary(settings):
        print(line)
    print("config ok")
    return 0


def register(subparsers: Any) -> None:
    config = subparsers.add_parser("config", help="check a gateway config file",
                                   description="Check gateway configuration.")
    sub = config.add_subparsers(dest="config_command", metavar="COMMAND", required=True)
    check = sub.add_parser(
        "check", help="load a config and print a summary (exit 2 naming the bad key)",
        description="Load a config exactly as 'mayu serve' would and print the profile, "
                    "stores, providers and models. A bad file exits 2 with an error that "
                    "names the offending key path.")
    check.add_argument("--config", metavar="FILE", default=None,
                       help="config file (default: none, the built-in local profile)")
    check.set_defaults(func=_check)
