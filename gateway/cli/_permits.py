"""``mayu permits …`` and ``mayu accounts …``: resolve what crashed gateways left behind.

A permit whose gateway crashed (or whose settlement failed) stays **pending** and keeps
binding every limit it charged (DESIGN §5); invalid upstream usage **freezes** the money
windows and accounts it charged. These commands replace hand-written SQL for both:
they open the configured governance store (``--config FILE``: the local SQLite file, or
the shared Postgres database) and go through the store's own settle path, so an operator
resolution is settled exactly once under the same replay / conflict rules as a gateway's.

``permits list`` also reads the replicas' journals (``--journal``, or the config's own):
a permit an unreadable journal line names is marked with the line's number and reason
(and shown even when the listing's filters leave it out), so the permits a damaged
journal could not settle are found and resolved here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from gateway import operations
from gateway.ceilings import MAX_AMOUNT
from gateway.cli._commands import add_command, command_group
from gateway.cli._keys import _positive, _table, format_usd
from gateway.config import Settings, load_settings
from gateway.errors import BadRequest, ConfigError, NotFound, SettlementConflict
from gateway.governance import (
    JournalEntry,
    OutcomeKind,
    Permit,
    PermitInfo,
    RejectedLine,
    Settlement,
    SettleResult,
    boot_id,
    quarantine_files,
    read_quarantine,
    recovered_outcome,
    scan_journal,
    settlement_for,
)
from gateway.jsondepth import MAX_JSON_DEPTH, json_too_deep
from gateway.keys import sqlite_path
from gateway.pricing import ModelPrice, Usage
from gateway.replicas import journal_path, orphan_journals

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
    from gateway.schema import check_schema

    if settings.database is None:  # load_settings already refuses this; be explicit
        raise ConfigError("database: required when governance_store.type is postgres")
    pool = await open_pool_now(settings.database, name="mayu-cli", what="governance database")
    try:  # the store calls the head's functions: refuse a database behind, naming migrate
        await check_schema(pool)
    except BaseException:
        await pool.close()
        raise
    store = PostgresGovernanceStore(pool)

    async def close() -> None:
        await store.close()  # its kept connections go back first
        await pool.close()
    return store, close


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
    journals = _list_journals(args)

    async def _list(store: Any) -> tuple[list[PermitInfo], dict[str, PermitInfo | None]]:
        infos: list[PermitInfo] = await store.permits(
            pending_only=args.pending, older_than_s=older, limit=args.limit)
        listed = {p.id for p in infos}
        # A permit an unreadable journal line names stays visible even when the
        # listing's filters leave it out: the operator needs its status to resolve it.
        named = {n.permit_id for n in journals if n.permit_id and n.permit_id not in listed}
        return infos, {pid: await store.permit_info(pid) for pid in sorted(named)}
    infos, others = _run(args, _list)
    notes = _journal_notes(journals, infos)
    if args.json:
        _print_json([{**msgspec.to_builtins(p), **(
            {"journal": notes[p.id]} if p.id in notes else {})} for p in infos])
        _print_unlisted(journals, {p.id for p in infos}, others, file=sys.stderr)
        return 0
    if not infos:
        print("no pending permits" if args.pending else "no permits")
    else:
        _table(("ID", "REQUEST", "KEY", "TEAM", "MODEL", "TOKEN BOUND", "USD BOUND",
                "STATUS", "USD COMMITTED", "USD LIABILITY", "AGE"),
               [(f"{p.id}{' *' if p.id in notes else ''}", p.request_id, p.key_id,
                 p.team_id, p.model, str(p.token_bound), format_usd(p.usd_bound), p.status,
                 "-" if p.usd_committed is None else format_usd(p.usd_committed),
                 "-" if p.usd_liability is None else format_usd(p.usd_liability),
                 _age(p.age_s)) for p in infos])
        if args.limit is not None and len(infos) == args.limit:
            print(f"(first {args.limit} shown, oldest first; raise --limit to see more)")
    if notes:
        print("\n* journal: a line of its replica's journal could not be read")
        for pid, lines in notes.items():
            for line in lines:
                print(f"  {pid}: {line}")
    _print_unlisted(journals, {p.id for p in infos}, others, file=sys.stdout)
    return 0


def _permits_prune(args: argparse.Namespace) -> int:
    from gateway.governance import cutoff, prune

    days = args.older_than_days or load_settings(args.config).governance_store.retention_days
    if days is None:
        raise ConfigError("--older-than-days: give it, or set "
                          "governance_store.retention_days in the config")
    before, month = cutoff(days)
    gone = _run(args, lambda store: prune(store, days))
    if args.json:
        _print_json({"pruned": gone, "admitted_before": before.isoformat(),
                     "months_before": month})
    else:
        print(f"pruned {gone} settled permits admitted before {before:%Y-%m-%d %H:%M} UTC "
              f"of months before {month} (their segments and request-log facts with "
              "them; pending permits and the current month are never pruned)")
    return 0


class _JournalLine(msgspec.Struct, frozen=True):
    """One unreadable line of a replica's journal, as ``permits list`` shows it."""

    permit_id: str | None
    where: str
    """The journal and line number, and the quarantine file that keeps it."""
    what: str
    """The record kind (when it can be told) and why it could not be read."""


def _list_journals(args: argparse.Namespace) -> list[_JournalLine]:
    """The unreadable lines of the ``--journal`` files (default: this config's journal
    and its workers', when present): those still in a journal no gateway has reopened,
    and those a restarted gateway kept in its ``.rejected`` quarantine files."""
    if args.journal:
        paths = list(args.journal)
        for path in paths:
            if not os.path.exists(path):
                raise ConfigError(f"--journal: no such file {path}")
    else:
        settings = load_settings(args.config)
        base = journal_path(settings)
        paths = [p for p in (base, *orphan_journals(settings, None))
                 if os.path.exists(p) or quarantine_files(p)]
    found: list[_JournalLine] = []
    for path in paths:
        for bad in scan_journal(path).rejected:
            found.append(_JournalLine(bad.permit_id, f"{path} line {bad.number}",
                                      _what(bad)))
        for kept in quarantine_files(path):
            for bad in read_quarantine(kept):
                line = f"line {bad.number}" if bad.number else "a line"
                when = f", {bad.at}" if bad.at else ""
                found.append(_JournalLine(bad.permit_id, f"{path} {line} (kept in "
                                          f"{kept}{when})", _what(bad)))
    return found


def _what(bad: RejectedLine) -> str:
    return f"{bad.record} record unreadable: {bad.reason}" if bad.record else (
        f"unreadable (record kind unknown): {bad.reason}")


def _journal_notes(journals: list[_JournalLine],
                   infos: list[PermitInfo]) -> dict[str, list[str]]:
    """Per listed permit: the unreadable lines naming it, and the settlement detail of
    one a gateway settled because of such a line (``journal line N unreadable``)."""
    listed = {p.id: p for p in infos}
    notes: dict[str, list[str]] = {}
    for line in journals:
        if line.permit_id in listed:
            notes.setdefault(line.permit_id, []).append(f"{line.where}: {line.what}")
    for p in infos:
        if p.detail and "journal line " in p.detail:
            notes.setdefault(p.id, []).append(f"settled {p.status}: {p.detail}")
    return notes


def _print_unlisted(journals: list[_JournalLine], listed: set[str],
                    others: dict[str, PermitInfo | None], *, file: Any) -> None:
    """The unreadable lines whose permit is not in the listing: its store status (or
    that the store does not know it), and the lines that name no permit at all."""
    rest = [line for line in journals if line.permit_id not in listed]
    if not rest:
        return
    print("\nunreadable journal lines of permits not listed above:", file=file)
    for line in rest:
        if line.permit_id is None:
            who = "no permit id recoverable"
        else:
            info = others.get(line.permit_id)
            who = (f"permit {line.permit_id} ({info.status})" if info is not None
                   else f"permit {line.permit_id} (not in this governance store)")
        print(f"  {who}: {line.where}: {line.what}", file=file)


def _price_of(settings: Settings, model: str) -> ModelPrice:
    price = operations.price_of(settings.models, model)
    if price is None:
        raise ConfigError(f"models: no model {model!r} in this config, so its usage cannot "
                          "be priced; pass --cost-micro-usd instead, or the config that "
                          "served it")
    return price


_USAGE_EXAMPLE = ('\'{"input": 1200, "output": 300, "cache_read": 0, "cache_write_5m": 0, '
                  '"cache_write_1h": 0}\'')


def parse_usage(text: str) -> Usage:
    """``--usage`` JSON as a :class:`Usage`, or :class:`BadRequest` naming the bad key
    (:func:`gateway.operations.usage_of`, the admin API's check); JSON nested deeper
    than the gateway takes a body (:data:`~gateway.jsondepth.MAX_JSON_DEPTH`) is refused
    before it is decoded."""
    if json_too_deep(text.encode()):
        raise BadRequest(f"--usage: nests deeper than {MAX_JSON_DEPTH} levels; e.g. "
                         f"{_USAGE_EXAMPLE}")
    try:
        raw = msgspec.json.decode(text.encode())
    except msgspec.DecodeError as exc:
        raise BadRequest(f"--usage: not valid JSON ({exc}); e.g. {_USAGE_EXAMPLE}") from None
    if not isinstance(raw, dict):
        raise BadRequest(f"--usage: must be a JSON object with at least one of "
                         f"{', '.join(operations.USAGE_KEYS)}; e.g. {_USAGE_EXAMPLE}")
    return operations.usage_of(raw, label="--usage")


def parse_figure(flag: str, text: str | None, unit: str) -> int | None:
    """``--cost-micro-usd`` / ``--tokens``: an integer in 0..``MAX_AMOUNT`` (the largest
    figure a settlement may carry), or :class:`BadRequest` naming the flag."""
    if text is None:
        return None
    try:
        value = int(text, 10)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_AMOUNT:
        raise BadRequest(f"{flag}: must be an integer in 0..{MAX_AMOUNT} ({unit}), "
                         f"got {text!r}")
    return value


def _exact_settlement(permit: Permit, args: argparse.Namespace,
                      settings: Settings) -> Settlement:
    """The settlement at an exact figure: ``--usage`` (priced with the model's price) or
    ``--cost-micro-usd`` (+ ``--tokens``; without it the tokens stay liability). Every
    figure is checked against the store's ceilings here, before anything is written."""
    if args.usage is not None:
        return operations.settlement_at_usage(permit, parse_usage(args.usage),
                                              _price_of(settings, permit.request.model),
                                              reason=args.reason)
    usd = parse_figure("--cost-micro-usd", args.cost_micro_usd, "µUSD")
    assert usd is not None  # _permits_resolve: --usage or --cost-micro-usd
    return operations.settlement_at_cost(
        permit, usd=usd, reason=args.reason,
        tokens=parse_figure("--tokens", args.tokens, "tokens"))


def _resolve_exact(args: argparse.Namespace) -> int:
    settings = load_settings(args.config)

    async def _exact(store: Any) -> SettleResult:
        permit = await operations.permit_of(store, args.permit_id)
        return await operations.settle_as_operator(
            store, args.permit_id, _exact_settlement(permit, args, settings), exact=True)
    result = _run(args, _exact)
    print(_result_line(result))
    return 0


def _result_line(result: SettleResult) -> str:
    what = _committed(result.kind, result.tokens_committed, result.usd_committed)
    if result.usd_liability or result.tokens_liability:
        what += (f", liability {result.tokens_liability} tokens, "
                 f"{format_usd(result.usd_liability)}")
    if result.replay:
        return f"permit {result.permit_id} was already resolved as {what}; nothing changed"
    return f"resolved permit {result.permit_id} as {what}"


def _permits_resolve(args: argparse.Namespace) -> int:
    if (args.permit_id is None) == (args.all_older_than_minutes is None):
        raise BadRequest("permits resolve: give a PERMIT_ID or --all-older-than-minutes N "
                         "(exactly one)")
    exact = args.usage is not None or args.cost_micro_usd is not None
    if args.usage is not None and args.cost_micro_usd is not None:
        raise BadRequest("permits resolve: --usage or --cost-micro-usd, not both")
    if args.tokens is not None and args.cost_micro_usd is None:
        raise BadRequest("permits resolve: --tokens goes with --cost-micro-usd")
    # Refused before any store is opened: a typo must not settle a permit (for good).
    if args.usage is not None:
        parse_usage(args.usage)
    parse_figure("--cost-micro-usd", args.cost_micro_usd, "µUSD")
    parse_figure("--tokens", args.tokens, "tokens")
    if args.all_older_than_minutes is not None:
        if exact:
            raise BadRequest("--usage/--cost-micro-usd: one PERMIT_ID at a time")
        return _resolve_bulk(args)
    if exact:
        return _resolve_exact(args)
    if args.as_ is None:
        raise BadRequest("permits resolve PERMIT_ID: give --as uncertain|cancelled, "
                         "--usage JSON or --cost-micro-usd N")
    kind = _AS[args.as_]
    result = _run(args, lambda s: operations.resolve_permit(s, args.permit_id, kind, args.reason))
    print(_result_line(result))
    return 0


_REPORTED_PER_FILE = 20


def _journal_entries(paths: list[str]) -> dict[str, JournalEntry]:
    """The permits the journals leave open; each unreadable line is reported on stderr
    (file, line number, what was wrong, never its content) and skipped."""
    entries: dict[str, JournalEntry] = {}
    for path in paths:
        if not os.path.exists(path):
            raise ConfigError(f"--journal: no such file {path}")
        scan = scan_journal(path)
        for bad in scan.rejected[:_REPORTED_PER_FILE]:
            permit = f", permit {bad.permit_id}" if bad.permit_id else ""
            print(f"mayu: warning: journal {path}: line {bad.number} skipped{permit} "
                  f"({bad.reason})", file=sys.stderr)
        if scan.rejected:
            more = len(scan.rejected) - _REPORTED_PER_FILE
            print(f"mayu: warning: journal {path}: {len(scan.rejected)} unreadable "
                  f"line(s) skipped{f' ({more} not listed)' if more > 0 else ''}; a "
                  "permit whose admit line is among them is resolved as if it were not "
                  "in the journal (uncertain), and one they may concern is never "
                  "resolved as cancelled", file=sys.stderr, flush=True)
        entries.update(scan.entries)
    return entries


def _resolve_bulk(args: argparse.Namespace) -> int:
    if args.as_ not in (None, "uncertain"):
        raise BadRequest("--all-older-than-minutes: only with --as uncertain (cancelled "
                         "refunds, which is only right per permit, when you know the "
                         "request never reached the provider; a replica's --journal "
                         "proves it)")
    journal = _journal_entries(args.journal or [])
    boot = boot_id()

    async def _one(store: Any, permit_id: str) -> SettleResult:
        entry = journal.get(permit_id)
        if entry is None:
            return await operations.resolve_permit(store, permit_id, OutcomeKind.UNCERTAIN,
                                                   args.reason)
        settlement = entry.settlement or settlement_for(
            entry.request, recovered_outcome(entry, boot))
        return await operations.settle_as_operator(store, permit_id, settlement, exact=False)

    async def _bulk(store: Any) -> int:
        stale = await store.permits(pending_only=True,
                                    older_than_s=args.all_older_than_minutes * 60)
        failed = 0
        for n, info in enumerate(stale, 1):
            prefix = f"[{n}/{len(stale)}]"
            source = " (from its journal)" if info.id in journal else ""
            try:
                result = await _one(store, info.id)
                print(f"{prefix} {_result_line(result)}{source}", flush=True)
            except (SettlementConflict, NotFound) as exc:
                # Its gateway may have settled it meanwhile: report it and go on.
                failed += 1
                print(f"{prefix} permit {info.id}: {exc.message}", flush=True)
        print(f"{len(stale) - failed} of {len(stale)} pending permits older than "
              f"{args.all_older_than_minutes} min resolved")
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
    _table(("COUNTER", "KIND", "LIMIT", "RESERVED", "COMMITTED", "LIABILITY",
            "FROZEN BY PERMIT"),
           [(f.counter, f.kind, "-" if f.limit is None else format_usd(f.limit),
             format_usd(f.reserved), format_usd(f.committed), format_usd(f.liability),
             f.frozen_by or "?") for f in frozen])
    return 0


def _accounts_unfreeze(args: argparse.Namespace) -> int:
    async def _lift(store: Any) -> str:
        if await operations.unfreeze(store, args.counter):
            return f"unfroze {args.counter}: admissions charging it are accepted again"
        return f"{args.counter} is not frozen; nothing changed"
    print(_run(args, _lift))
    return 0


# -- parser --------------------------------------------------------------------------------

_CONFIG_HELP = ("gateway config file; its governance_store selects the local SQLite file "
                "or the shared Postgres database (default: none, the local profile with "
                "its data in .mayu)")

_RESOLVE = """Settle a permit as an operator, through the governance store's normal
settle path: exactly once, with the same rules as a gateway's settlement (resolving again
with the same outcome is a harmless replay; a different outcome is refused and the stored
one is shown).

  --as uncertain   commits nothing unobserved: the bounds become liability (they keep
                   binding the hard limits of their windows, but are not spend). The safe
                   choice for a crashed gateway without a journal.
  --as cancelled   refunds everything, requests-per-minute included. Only right when you
                   KNOW the request never reached the provider.
  --usage JSON     settles at the exact usage (e.g. the provider's record), priced with
                   the model's price from --config: '{"input": 1200, "output": 300,
                   "cache_read": 0, "cache_write_5m": 0, "cache_write_1h": 0}'. Works on a
                   pending permit and on one settled uncertain or tokens_known (its
                   liability is replaced by the exact figure).
  --cost-micro-usd N [--tokens T]
                   the same with an exact µUSD figure; without --tokens the token count
                   stays liability.

A --usage key that is not a usage class (a typo), a value that is not an integer in
0..2**40, or a --cost-micro-usd/--tokens figure outside 0..2**50 is refused (exit 2)
before the store is opened: nothing is settled.

With --all-older-than-minutes N, every permit still pending after N minutes is resolved,
one progress line per permit; choose N above your longest request timeout so no live
request is resolved under its gateway. Give the crashed replicas' journals with
--journal FILE (repeatable): a permit found there is resolved from what its replica
recorded (never dispatched -> cancelled, outcome observed -> settled as observed,
dispatched -> uncertain); the others as uncertain. An unreadable journal line is reported
(file, line number, reason) and skipped; a permit it may concern (it names the permit, or
names none and comes after its admit) is never resolved as cancelled: the line may have
been its dispatch record."""


def _add(sub: Any, name: str, func: Callable[[argparse.Namespace], int], summary: str,
         description: str | None = None) -> argparse.ArgumentParser:
    parser = add_command(sub, name, func, summary=summary, description=description,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", metavar="FILE", default=None, help=_CONFIG_HELP)
    return parser


def _register_permits(subparsers: Any) -> None:
    sub = command_group(
        subparsers, "permits", summary="list and resolve pending permits (crashed gateways)",
        description="List permits and resolve the ones crashed gateways left pending "
                    "(a pending permit keeps binding every limit it charged).")
    listing = _add(sub, "list", _permits_list, "list permits, oldest first: id, request "
                   "id, key, team, model, bounds, status, committed and liability µUSD, "
                   "and age; a permit an unreadable journal line concerns is marked *, "
                   "with the line and the reason")
    listing.add_argument("--pending", action="store_true",
                         help="only permits not settled yet")
    listing.add_argument("--older-than-minutes", type=_positive, metavar="N",
                         help="only permits admitted at least N minutes ago (store clock)")
    listing.add_argument("--limit", type=_positive, metavar="N", default=200,
                         help="show at most N permits (default 200)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument("--journal", action="append", metavar="FILE",
                         help="a replica's journal (repeatable): the permits its "
                              "unreadable lines name are marked, with the reason, and shown "
                              "even when not listed (default: this config's journal and "
                              "its workers', when present; the lines a restarted gateway "
                              "kept in FILE.rejected included)")
    pruning = _add(sub, "prune", _permits_prune, "delete settled permits past the "
                   "request log's retention (of ended months only), with their segments "
                   "and facts")
    pruning.add_argument("--older-than-days", type=_positive, metavar="N",
                         help="admitted more than N days ago (default: "
                              "governance_store.retention_days)")
    pruning.add_argument("--json", action="store_true", help="print JSON")
    resolve = _add(sub, "resolve", _permits_resolve, "settle a permit: uncertain (bounds "
                   "become liability), cancelled (refund), or at an exact usage/cost",
                   _RESOLVE)
    resolve.add_argument("permit_id", metavar="PERMIT_ID", nargs="?",
                         help="the permit (see mayu permits list --pending)")
    resolve.add_argument("--as", dest="as_", choices=sorted(_AS),
                         help="uncertain: the bounds become liability; cancelled: refund "
                              "everything, only when the request never reached the provider")
    resolve.add_argument("--usage", metavar="JSON",
                         help="settle at this exact usage (token classes), priced with the "
                              "model's price from --config")
    # Both checked by parse_figure (one error line naming the flag and the range).
    resolve.add_argument("--cost-micro-usd", metavar="N",
                         help="settle at this exact cost in µUSD")
    resolve.add_argument("--tokens", metavar="T",
                         help="with --cost-micro-usd: the exact token count")
    resolve.add_argument("--journal", action="append", metavar="FILE",
                         help="with --all-older-than-minutes: a crashed replica's "
                              "journal (repeatable)")
    resolve.add_argument("--reason", default="no reason given", metavar="TEXT",
                         help="why, recorded in the settlement's detail as 'operator: TEXT'")
    resolve.add_argument("--all-older-than-minutes", type=_positive, metavar="N",
                         help="instead of one PERMIT_ID: every permit pending for at least "
                              "N minutes (only with --as uncertain)")


def _register_accounts(subparsers: Any) -> None:
    sub = command_group(
        subparsers, "accounts", summary="list and unfreeze money counters frozen by invalid usage",
        description="Invalid upstream usage freezes every money window and policy "
                    "account its permit charged (later requests on them get 402) until "
                    "an operator has investigated and unfreezes them.")
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
