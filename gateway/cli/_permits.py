"""``mayu permits …`` and ``mayu accounts …``: resolve what crashed gateways left behind.

A permit whose gateway crashed (or whose settlement failed) stays **pending** and keeps
binding every limit it charged (DESIGN §5); invalid upstream usage **freezes** the money
windows and accounts it charged. These commands replace hand-written SQL for both:
they open the configured governance store (``--config FILE``: the local SQLite file, or
the shared Postgres database) and go through the store's own settle path, so an operator
resolution is settled exactly once under the same replay / conflict rules as a gateway's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from gateway.cli._keys import _positive, _table, format_usd
from gateway.config import Settings, load_settings
from gateway.errors import BadRequest, ConfigError, NotFound, SettlementConflict, UnknownPermit
from gateway.governance import (
    Outcome,
    OutcomeKind,
    PermitInfo,
    SettleResult,
    commits_for,
)
from gateway.keys._open import sqlite_path

T = TypeVar("T")
_AS = {"uncertain": OutcomeKind.UNCERTAIN, "cancelled": OutcomeKind.CANCELLED}


# -- opening the store ---------------------------------------------------------------------

async def open_governance(settings: Settings) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """The configured governance store and the coroutine function that closes it."""
    if settings.governance_store.type == "postgres":
        return await _open_postgres(settings)
    from gateway.governance import LocalGovernanceStore

    path = sqlite_path(settings, settings.governance_store.path)
    if not os.path.exists(path):
        # Opening would create an empty store: almost always the wrong directory.
        raise ConfigError(f"governance_store.path: no local governance store at {path} "
                          "(run from the gateway's directory or pass --config)")
    store = LocalGovernanceStore(path)
    await store.open()
    return store, store.close


async def _open_postgres(settings: Settings) -> tuple[Any, Callable[[], Awaitable[None]]]:
    from gateway.db import open_pool_now
    from gateway.governance import PostgresGovernanceStore

    if settings.database is None:  # load_settings already refuses this; be explicit
        raise ConfigError("database: required when governance_store.type is postgres")
    pool = await open_pool_now(settings.database, name="mayu-cli", what="governance database")
    return PostgresGovernanceStore(pool), pool.close


def _run(args: argparse.Namespace, action: Callable[[Any], Awaitable[T]]) -> T:
    async def _main() -> T:
        store, close = await open_governance(load_settings(args.config))
        try:
            return await action(store)
        finally:
            await close()
    return asyncio.run(_main())


# -- formatting ----------------------------------------------------------------------------

def _age(seconds: int) -> str:
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def _committed(kind: OutcomeKind | str, tokens: int | None, usd: int | None) -> str:
    return f"{kind}: committed {tokens} tokens, {format_usd(usd)}"


def _print_json(value: Any) -> None:
    print(json.dumps(msgspec.to_builtins(value), indent=2, sort_keys=True))


# -- permits -------------------------------------------------------------------------------

def _permits_list(args: argparse.Namespace) -> int:
    older = None if args.older_than_minutes is None else args.older_than_minutes * 60
    infos: list[PermitInfo] = _run(args, lambda s: s.permits(
        pending_only=args.pending, older_than_s=older, limit=args.limit))
    if args.json:
        _print_json(infos)
        return 0
    if not infos:
        print("no pending permits" if args.pending else "no permits")
        return 0
    _table(("ID", "REQUEST", "KEY", "TEAM", "MODEL", "TOKEN BOUND", "USD BOUND", "STATUS",
            "AGE"),
           [(p.id, p.request_id, p.key_id, p.team_id, p.model, str(p.token_bound),
             format_usd(p.usd_bound), p.status, _age(p.age_s)) for p in infos])
    if args.limit is not None and len(infos) == args.limit:
        print(f"(first {args.limit} shown, oldest first; raise --limit to see more)")
    return 0


async def _resolve_one(store: Any, permit_id: str, kind: OutcomeKind,
                       reason: str) -> SettleResult:
    """Settle one permit through the store's normal path (exactly once)."""
    permit = await store.get_permit(permit_id)
    if permit is None:
        raise UnknownPermit(f"permit {permit_id!r}: no such permit in this governance "
                            "store (see mayu permits list)")
    outcome = Outcome(kind=kind, detail=f"operator: {reason}")
    try:
        result: SettleResult = await store.settle(permit_id, outcome,
                                                  commits_for(permit.request, outcome))
    except SettlementConflict:
        stored = await store.permit_info(permit_id)
        raise SettlementConflict(
            f"permit {permit_id} was already settled as {_stored(stored)}; resolving it "
            f"as {kind} is refused (a permit is settled exactly once)") from None
    return result


def _stored(info: PermitInfo | None) -> str:
    if info is None:
        return "an unknown outcome"
    text = _committed(info.status, info.tokens_committed, info.usd_committed)
    return f"{text}{f' ({info.detail})' if info.detail else ''}"


def _result_line(result: SettleResult) -> str:
    what = _committed(result.kind, result.tokens_committed, result.usd_committed)
    if result.replay:
        return f"permit {result.permit_id} was already resolved as {what}; nothing changed"
    return f"resolved permit {result.permit_id} as {what}"


def _permits_resolve(args: argparse.Namespace) -> int:
    if (args.permit_id is None) == (args.all_older_than_minutes is None):
        raise BadRequest("permits resolve: give a PERMIT_ID or --all-older-than-minutes N "
                       "(exactly one)")
    if args.all_older_than_minutes is not None:
        return _resolve_bulk(args)
    kind = _AS[args.as_]
    result = _run(args, lambda s: _resolve_one(s, args.permit_id, kind, args.reason))
    print(_result_line(result))
    return 0


def _resolve_bulk(args: argparse.Namespace) -> int:
    if args.as_ != "uncertain":
        raise BadRequest("--all-older-than-minutes: only with --as uncertain (cancelled "
                          "refunds, which is only right per permit, when you know the "
                          "request never reached the provider)")

    async def _bulk(store: Any) -> int:
        stale = await store.permits(pending_only=True,
                                    older_than_s=args.all_older_than_minutes * 60)
        failed = 0
        for n, info in enumerate(stale, 1):
            prefix = f"[{n}/{len(stale)}]"
            try:
                result = await _resolve_one(store, info.id, OutcomeKind.UNCERTAIN,
                                            args.reason)
                print(f"{prefix} {_result_line(result)}", flush=True)
            except (SettlementConflict, NotFound) as exc:
                # Its gateway may have settled it meanwhile: report it and go on.
                failed += 1
                print(f"{prefix} permit {info.id}: {exc.message}", flush=True)
        print(f"{len(stale) - failed} of {len(stale)} pending permits older than "
              f"{args.all_older_than_minutes} min resolved as uncertain")
        return 1 if failed else 0
    return _run(args, _bulk)


# -- accounts ------------------------------------------------------------------------------

def _accounts_frozen(args: argparse.Namespace) -> int:
    frozen = _run(args, lambda s: s.frozen())
    if args.json:
        _print_json(frozen)
        return 0
    if not frozen:
        print("no frozen counters")
        return 0
    _table(("COUNTER", "KIND", "LIMIT", "RESERVED", "COMMITTED", "FROZEN BY PERMIT"),
           [(f.counter, f.kind, "-" if f.limit is None else format_usd(f.limit),
             format_usd(f.reserved), format_usd(f.committed), f.frozen_by or "?")
            for f in frozen])
    return 0


def _accounts_unfreeze(args: argparse.Namespace) -> int:
    async def _lift(store: Any) -> str:
        if await store.unfreeze(args.counter):
            return f"unfroze {args.counter}: admissions charging it are accepted again"
        if await store.counter(args.counter) is None:
            raise NotFound(f"counter {args.counter!r}: no such counter or account "
                           "(see mayu accounts frozen)")
        return f"{args.counter} is not frozen; nothing changed"
    print(_run(args, _lift))
    return 0


# -- parser --------------------------------------------------------------------------------

_CONFIG_HELP = ("gateway config file; its governance_store selects the local SQLite file "
                "or the shared Postgres database (default: none, the local profile with "
                "its data in .mayu)")

_RESOLVE = """Settle a pending permit as an operator, through the governance store's normal
settle path: exactly once, with the same rules as a gateway's settlement (resolving again
with the same outcome is a harmless replay; a different outcome is refused and the stored
one is shown).

  --as uncertain   keeps the token and µUSD bounds committed (nothing possibly spent is
                   refunded). The safe choice for a crashed gateway.
  --as cancelled   refunds everything, requests-per-minute included. Only right when you
                   KNOW the request never reached the provider (e.g. the audit log or the
                   provider's records show it was never sent).

With --all-older-than-minutes N, every permit still pending after N minutes is resolved as
uncertain, one progress line per permit; choose N above your longest request timeout so
no live request is resolved under its gateway."""


def _add(sub: Any, name: str, func: Callable[[argparse.Namespace], int], summary: str,
         description: str | None = None) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=summary, description=description or summary,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", metavar="FILE", default=None, help=_CONFIG_HELP)
    parser.set_defaults(func=func)
    return parser


def _register_permits(subparsers: Any) -> None:
    permits = subparsers.add_parser(
        "permits", help="list and resolve pending permits (crashed gateways)",
        description="List permits and resolve the ones crashed gateways left pending "
                    "(a pending permit keeps binding every limit it charged).")
    sub = permits.add_subparsers(dest="permits_command", metavar="COMMAND", required=True)
    listing = _add(sub, "list", _permits_list, "list permits, oldest first: id, request "
                   "id, key, team, model, bounds, status and age")
    listing.add_argument("--pending", action="store_true",
                         help="only permits not settled yet")
    listing.add_argument("--older-than-minutes", type=_positive, metavar="N",
                         help="only permits admitted at least N minutes ago (store clock)")
    listing.add_argument("--limit", type=_positive, metavar="N", default=200,
                         help="show at most N permits (default 200)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    resolve = _add(sub, "resolve", _permits_resolve, "settle a pending permit as uncertain "
                   "(bounds kept) or cancelled (refund: only if it never reached the "
                   "provider)", _RESOLVE)
    resolve.add_argument("permit_id", metavar="PERMIT_ID", nargs="?",
                         help="the permit (see mayu permits list --pending)")
    resolve.add_argument("--as", dest="as_", required=True, choices=sorted(_AS),
                         help="uncertain: keep the bounds committed; cancelled: refund "
                              "everything, only when the request never reached the provider")
    resolve.add_argument("--reason", default="no reason given", metavar="TEXT",
                         help="why, recorded in the settlement's detail as 'operator: TEXT'")
    resolve.add_argument("--all-older-than-minutes", type=_positive, metavar="N",
                         help="instead of one PERMIT_ID: every permit pending for at least "
                              "N minutes (only with --as uncertain)")


def _register_accounts(subparsers: Any) -> None:
    accounts = subparsers.add_parser(
        "accounts", help="list and unfreeze money counters frozen by invalid usage",
        description="Invalid upstream usage freezes every money window and policy "
                    "account its permit charged (later requests on them get 402) until "
                    "an operator has investigated and unfreezes them.")
    sub = accounts.add_subparsers(dest="accounts_command", metavar="COMMAND", required=True)
    frozen = _add(sub, "frozen", _accounts_frozen, "list frozen counters and accounts, "
                  "with the permit whose invalid usage froze each")
    frozen.add_argument("--json", action="store_true", help="print JSON")
    unfreeze = _add(sub, "unfreeze", _accounts_unfreeze, "lift the freeze on one counter "
                    "or account (after investigating the invalid usage)")
    unfreeze.add_argument("counter", metavar="COUNTER",
                          help="the counter key (see mayu accounts frozen)")


def register(subparsers: Any) -> None:
    _register_permits(subparsers)
    _register_accounts(subparsers)
