"""``mayu migrate``: bring the shared database's schema to this version's head.

The database is the ``--config`` file's ``database.dsn_ref`` (default
``env:INFERPLANE_DATABASE_URL``, also without a config file). The migrations are the ones
packaged with this version (:mod:`gateway.schema`), so an installed image needs no
checkout. One progress line per applied revision; the password is never printed.
"""

from __future__ import annotations

import argparse
from typing import Any

from gateway.cli._commands import add_command
from gateway.config import DatabaseSettings, load_settings, resolve_secret
from gateway.schema import Step, code_heads, describe_dsn, upgrade


def _dsn(args: argparse.Namespace) -> str:
    db = DatabaseSettings()
    if args.config:
        db = load_settings(args.config).database or db
    return resolve_secret(db.dsn_ref, key="database.dsn_ref")


def _migrate(args: argparse.Namespace) -> int:
    import psycopg

    from gateway.errors import ConfigError
    from gateway.schema import database_heads

    dsn = _dsn(args)
    where = describe_dsn(dsn)
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            before = database_heads(conn)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"database.dsn_ref: cannot connect to {where} ({first})") from exc
    heads = ", ".join(code_heads())
    print(f"mayu migrate: {where} at {', '.join(before) or 'no revision'}; "
          f"target {args.revision} ({heads})", flush=True)

    def step(s: Step) -> None:
        print(f"mayu migrate: applied {s.down_revision or 'base'} -> {s.revision}"
              f" ({s.seconds:.2f} s): {s.doc}", flush=True)

    after = upgrade(dsn, target=args.revision, on_step=step)
    print(f"mayu migrate: {where} now at {', '.join(after) or 'no revision'}"
          + (" (already current)" if after == before else ""), flush=True)
    return 0


def register(sub: Any) -> None:
    p = add_command(
        sub, "migrate", _migrate,
        summary="upgrade the shared database schema (alembic upgrade head)",
        description="Apply this version's packaged migrations to the database of "
                    "--config's database.dsn_ref (default env:INFERPLANE_DATABASE_URL), "
                    "printing one line per applied revision.")
    p.add_argument("--config", metavar="FILE", default=None,
                   help="gateway config whose database.dsn_ref names the database")
    p.add_argument("--revision", default="head", help="target revision (default: head)")
