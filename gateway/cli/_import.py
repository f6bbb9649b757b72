"""``mayu keys import --from SQLITE_FILE --config SHARED.yaml``: move a local-profile key
store into the shared Postgres one (ADR-046; :mod:`gateway.keys._import`).

Registered as a sub-command of ``mayu keys`` (which :mod:`gateway.cli._keys` creates),
so it sits beside ``create``, ``list`` and ``revoke`` in ``--help``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import msgspec

from gateway.config import load_settings
from gateway.db import open_pool_now
from gateway.errors import ConfigError
from gateway.keys._import import import_records, read_sqlite


def _import(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    if settings.key_store.type != "postgres" or settings.database is None:
        raise ConfigError("key_store.type: must be postgres (with a database section) to "
                          "import into the shared key store")
    database = settings.database

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    async def main() -> Any:
        teams, keys = await read_sqlite(args.source)
        progress(f"read {len(teams)} teams and {len(keys)} keys "
                 f"({sum(k.revoked_at is not None for k in keys)} revoked) from {args.source}")
        pool = await open_pool_now(database, name="mayu-import", what="key store database")
        try:
            return await import_records(pool, teams, keys, progress=progress)
        finally:
            await pool.close()

    report = asyncio.run(main())
    if args.json:
        print(json.dumps(msgspec.to_builtins(report), sort_keys=True))
    else:
        print(f"imported {report.teams_added} teams and {report.keys_added} keys "
              f"({report.teams_unchanged} teams and {report.keys_unchanged} keys were "
              "already there, identical)")
    return 0


def _keys_subcommands(subparsers: Any) -> Any:
    keys = subparsers.choices.get("keys")
    if keys is None:
        return None
    for action in keys._actions:  # argparse keeps sub-parser groups only here
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def register(subparsers: Any) -> None:
    sub = _keys_subcommands(subparsers)
    if sub is None:  # a build without ``mayu keys``: nothing to attach to
        return
    summary = ("copy a local-profile SQLite key store (teams, key hashes, revocations) "
               "into the shared Postgres key store, in one transaction")
    parser = sub.add_parser("import", help=summary, description=summary + ". Stop the "
                            "local gateway first. An identical retry changes nothing; a "
                            "conflicting row aborts the whole import.")
    parser.add_argument("--from", dest="source", required=True, metavar="SQLITE_FILE",
                        help="the local profile's store file (e.g. .mayu/mayu.db)")
    parser.add_argument("--config", metavar="FILE", required=True,
                        help="the shared-profile config (key_store.type: postgres)")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.set_defaults(func=_import)
