"""``mayu config check``: run every check ``mayu serve`` runs on a config, and summarise it.

The checks are :func:`gateway.cli._checks.preflight`, the same function serve calls, so
"config ok" means serve gets past its configuration: ranges, secret references
resolvable, the policy source allowed for the profile, policy files valid. A bad file
exits 2 with the error naming the key path (``providers[0].base_url: …``; one line per
policy problem), so an operator finds a mistake before a deploy, not in a crash loop.
``--database`` also checks that the shared database answers and is migrated. Secret
values are never printed: only their references, and never an inline value or the
credentials of a URL.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gateway.cli._checks import check_database, preflight
from gateway.cli._commands import add_command, command_group
from gateway.config import Settings, is_reference, load_settings
from gateway.policy import PolicyInvalid
from gateway.pricing import CLASSES


def _profile(settings: Settings) -> str:
    workers = settings.server.workers
    processes = f"; {workers} worker processes on this host" if workers > 1 else ""
    if settings.shared:
        return f"shared (Postgres key store and governance; N replicas{processes})"
    if settings.control_plane is not None:
        return "lease (local stores bounded by control-plane leases)"
    if workers > 1:
        return (f"local (SQLite key store and governance, one file; {workers} worker "
                f"processes on this host)")
    return "local (SQLite key store and governance; exactly one replica)"


def _dollars(micros: int) -> str:
    whole, frac = divmod(micros, 1_000_000)
    return f"${whole}.{f'{frac:06d}'.rstrip('0').ljust(2, '0')}"


def _secret(ref: str | None, key: str) -> str:
    """A reference as printed: preflight resolved it already; an inline value (which
    preflight refuses) is never echoed."""
    if ref is None:
        return "none"
    return f"{ref} (resolves)" if is_reference(ref) else "(inline value, not shown)"


def _url(url: str) -> str:
    """A URL without the user:password part it may carry."""
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _stores(settings: Settings) -> list[str]:
    default = f"{settings.data_dir}/mayu.db"
    lines = [f"data dir: {settings.data_dir}"]
    ks, gs = settings.key_store, settings.governance_store
    lines.append(f"key store: {ks.type}"
                 + (f" {ks.path or default}" if ks.type == "sqlite" else ""))
    lines.append(f"governance store: {gs.type}"
                 + (f" {gs.path or default}" if gs.type == "local" else ""))
    if settings.database is not None:
        ref = settings.database.dsn_ref
        dsn = (_secret(ref, "database.dsn_ref") if settings.shared
               else (ref if is_reference(ref) else "(inline value, not shown)")
               + " (unused by this profile)")
        lines.append("database: dsn " + dsn
                     + f", pool {settings.database.pool_min_size}.."
                       f"{settings.database.pool_max_size}")
    return lines


def _providers(settings: Settings) -> list[str]:
    lines = [f"providers ({len(settings.providers)}):"]
    for i, p in enumerate(settings.providers):
        where = f" {_url(p.base_url)}" if p.base_url else ""
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
        return [f"policies: control plane {_url(settings.control_plane.url)} (token {token})"]
    if settings.policies:
        return ["policies: files " + ", ".join(settings.policies)]
    return ["policies: none"]


def summary(settings: Settings) -> list[str]:
    s = settings.server
    lines = [f"profile: {_profile(settings)}",
             f"server: {s.host}:{s.port}, max body {s.max_body_bytes} bytes, "
             f"max output tokens {s.max_output_tokens}",
             f"http: max header {s.max_header_bytes} bytes, header timeout "
             f"{s.header_timeout_s:g} s, body timeout {s.body_timeout_s:g} s, keep-alive "
             f"{s.keep_alive_s:g} s, max connections {s.max_connections}, shutdown grace "
             f"{s.shutdown_grace_s:g} s",
             f"metrics: token {_secret(s.metrics_token_ref, 'server.metrics_token_ref')}, "
             f"team names as labels: {'yes' if s.metrics_team_labels else 'no'}",
             f"admin token: {_secret(s.admin_token_ref, 'server.admin_token_ref')}",
             *_stores(settings), *_providers(settings), *_models(settings),
             *_policy(settings)]
    if settings.bootstrap_teams:
        lines.append("bootstrap teams: " + ", ".join(t.name for t in settings.bootstrap_teams))
    lines.append("demo team on first run: " + ("yes" if settings.demo else "no"))
    return lines


def _check(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    try:
        preflight(settings)
    except PolicyInvalid as exc:
        for path, message in exc.problems:  # one line per problem, as serve prints them
            print(f"mayu: error: policies: {path}: {message}", file=sys.stderr)
        return 2
    database = check_database(settings) if args.database else None
    print(f"config: {args.config or 'none (built-in local defaults)'}")
    for line in summary(settings):
        print(line)
    if database:
        print(f"database: {database}")
    print("config ok")
    return 0


def register(subparsers: Any) -> None:
    sub = command_group(
        subparsers, "config", summary="check a gateway config file",
        description="Check gateway configuration.")
    check = add_command(
        sub, "check", _check,
        summary="load a config and print a summary (exit 2 naming the bad key)",
        description="Run every check 'mayu serve' runs on a config (ranges, secret "
                    "references, policy source and files) and print the profile, stores, "
                    "providers and models. A bad file exits 2 with an error that names the "
                    "offending key path. Secret values are never printed.")
    check.add_argument("--config", metavar="FILE", default=None,
                       help="config file (default: none, the built-in local profile)")
    check.add_argument("--database", action="store_true",
                       help="shared profile: also check the database answers and is "
                            "migrated to this version's schema")
