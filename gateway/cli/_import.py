"""``mayu keys import --from SQLITE_FILE --config SHARED.yaml``: move a local-profile key
store and its open month's spend into the shared Postgres one (ADR-046;
:mod:`gateway.keys._import`, :mod:`gateway.governance._import`).

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
from gateway.governance import CutoverReport, import_cutover, read_spend
from gateway.keys import read_people, read_sqlite


def _print(report: CutoverReport) -> None:
    keys, spend = report.keys, report.spend
    prefix = "dry run, nothing written: would have " if report.dry_run else ""
    print(f"{prefix}imported {keys.teams_added} teams and {keys.keys_added} keys "
          f"({keys.teams_unchanged} teams and {keys.keys_unchanged} keys were already "
          "there, identical)")
    print(f"{prefix}imported {keys.users_added} users and {keys.members_added} member "
          f"budgets ({keys.users_unchanged} users and {keys.members_unchanged} member "
          "budgets were already there, identical)")
    print(f"{prefix}moved the spend of {spend.permits_added} permits of {spend.month} "
          f"({spend.permits_unchanged} imported before, {spend.invalid_permits} invalid) "
          f"into {spend.counters_changed} windows and accounts")
    for t in spend.teams:
        d, m = t.day, t.month
        line = (f"  team {t.name} ({t.team_id}): day {spend.day} committed {d.committed} "
                f"µUSD, liability {d.liability} µUSD; month {spend.month} committed "
                f"{m.committed} µUSD, liability {m.liability} µUSD")
        if m.reserved:
            line += f"; invalid permits keep {m.reserved} µUSD reserved"
        print(line)


def _import(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)
    if settings.key_store.type != "postgres" or settings.database is None:
        raise ConfigError("key_store.type: must be postgres (with a database section) to "
                          "import into the shared key store")
    database = settings.database

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    async def main() -> CutoverReport:
        teams, keys = await read_sqlite(args.source)
        people = await read_people(args.source)
        progress(f"read {len(teams)} teams and {len(keys)} keys "
                 f"({sum(k.revoked_at is not None for k in keys)} revoked), "
                 f"{len(people.users)} users and {len(people.members)} member budgets "
                 f"from {args.source}")
        spend_file = args.spend_source or args.source
        spend = read_spend(spend_file)
        progress(f"read {len(spend.permits)} permits of {spend.month} (none pending) from "
                 f"{spend_file}")
        pool = await open_pool_now(database, name="mayu-import", what="key store database")
        try:
            return await import_cutover(pool, teams, keys, spend, people=people,
                                        dry_run=args.dry_run, progress=progress)
        finally:
            await pool.close()

    report = asyncio.run(main())
    if args.json:
        print(json.dumps({**msgspec.to_builtins(report.keys),
                          "spend": msgspec.to_builtins(report.spend),
                          "dry_run": report.dry_run}, sort_keys=True))
    else:
        _print(report)
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
    summary = ("copy a local-profile SQLite store (teams, key hashes, revocations, and "
               "the open month's spend) into the shared Postgres store, in one transaction")
    parser = sub.add_parser("import", help=summary, description=summary + ". Stop the "
                            "local gateway first: a pending permit refuses the import. "
                            "Every permit of the current UTC month is copied and adds "
                            "its committed and liability to the shared windows and policy "
                            "accounts once; RPM/TPM buckets are not moved. An identical "
                            "retry changes nothing; a conflicting row aborts the whole "
                            "import (docs/shared-profile.md).")
    parser.add_argument("--from", dest="source", required=True, metavar="SQLITE_FILE",
                        help="the local profile's store file (e.g. .mayu/mayu.db)")
    parser.add_argument("--spend-from", dest="spend_source", metavar="SQLITE_FILE",
                        help="the local governance file, when governance_store.path is "
                             "not the key store's file (default: --from)")
    parser.add_argument("--config", metavar="FILE", required=True,
                        help="the shared-profile config (key_store.type: postgres)")
    parser.add_argument("--dry-run", action="store_true",
                        help="check and count everything, write nothing")
    parser.add_argument("--json", action="store_true",
                        help="print the counts and the moved spend as JSON")
    parser.set_defaults(func=_import)
