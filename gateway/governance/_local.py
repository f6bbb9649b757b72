"""The local-profile governance store: counters, permits and settlements in SQLite.

One replica, one file. Every transaction is ``BEGIN IMMEDIATE``: the write lock is
taken before the first read, so the counters a decision reads cannot change before it
writes. Admissions and settlements go through a :class:`gateway.governance._localbatch.
Batcher`: a lone one runs at once, inline on the event loop when the file is free (else
in a worker thread: :class:`gateway.localdb.SqliteBase`); those pending at the same
time (arriving in one loop turn, or while a transaction runs in a thread) share one
transaction, each decided on the running state, each with its own answer, every answer
given after the shared ``COMMIT`` (``_localbatch`` says why that is exact). The
arithmetic is the shared pure code in :mod:`gateway.governance._plan`; only the
atomicity is local. Everything is persisted, so a restart loses no committed spend and
forgets no pending permit (pending permits keep their reservations, which keep binding
the limits). The tables and statements are ``sql/local/governance.sql``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import msgspec

import sql
from gateway.errors import SettlementConflict, UnknownPermit
from gateway.governance._counters import (
    CounterState,
    clamp,
    load_counter,
    read_counter,
    reserve,
    resolve_counter,
    settle_counter,
    store_counter,
)
from gateway.governance._localbatch import Batch, Batcher
from gateway.governance._model import (
    AdmissionRequest,
    Charge,
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
    Settlement,
    SettleResult,
    StoredFigures,
    UsageRow,
    is_slot,
)
from gateway.governance._ops import (
    FrozenCounter,
    LogFilter,
    PermitInfo,
    SummaryFigures,
    local_frozen,
    local_get_permit,
    local_permit_info,
    local_permits,
    local_request_log,
    local_request_summary,
)
from gateway.governance._plan import (
    check_settlement,
    refill,
    settlement_fingerprint,
    validate_request,
)
from gateway.governance._settle import settlement_for
from gateway.governance._snapshot import has_key_tables, snapshot_refusal
from gateway.governance._usage import usage_rows
from gateway.localdb import SqliteBase, Statements
from gateway.pricing import InvalidUsage

_SQL = Statements(sql.local_governance)
# The request path's writes take their values in this order (checked here, at import).
_INSERT_PERMIT = _SQL["insert_permit"].expect(
    "id", "request_id", "key_id", "team_id", "user", "model", "day", "month", "token_bound",
    "usd_bound", "request", "created_us")
_INSERT_CHARGE = _SQL["insert_charge"].expect(
    "permit_id", "seq", "counter", "kind", "dimension", "amount", "limit", "window",
    "rule_uid", "hard")
_CLAIM_PERMIT = _SQL["claim_permit"].expect("status", "id")
_SETTLE_CHARGE = _SQL["settle_charge"].expect("committed", "liability", "permit_id", "seq")
_INSERT_SETTLEMENT = _SQL["insert_settlement"].expect(
    "permit_id", "kind", "fingerprint", "tokens_committed", "usd_committed", "detail",
    "settled_us", "tokens_liability", "usd_liability", "bound_exceeded")
_INSERT_FACTS = _SQL["insert_permit_facts"].expect(
    "permit_id", "route", "deployment", "client", "http_status", "input", "output",
    "cache_read", "cache_write_5m", "cache_write_1h", "cache_write_unknown")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_GRANTED = 100_000
"""Settlement hints kept at most (each a few hundred bytes; one per request in flight)."""
T = TypeVar("T")
log = logging.getLogger("mayu.governance")


def _insert_facts(conn: sqlite3.Connection, permit_id: str, s: Settlement) -> None:
    """The request log's facts of a settlement (route, deployment, client, status, tokens
    per class), when it has any; once per permit."""
    if s.facts is None and s.usage is None:
        return
    f, u = s.facts, s.usage
    _INSERT_FACTS.execute_values(
        conn, permit_id, f and f.route, f and f.deployment, f and f.client,
        f and f.http_status, u and u.input, u and u.output, u and u.cache_read,
        u and u.cache_write_5m, u and u.cache_write_1h, u and u.cache_write_unknown)


class LocalGovernanceStore(SqliteBase):
    """:class:`gateway.governance.GovernanceStore` on a SQLite file (one replica)."""

    schema = sql.local_governance["schema"]

    def __init__(self, path: str, *,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 max_batch: int = 64) -> None:
        """``max_batch``: operations per shared transaction at most (1: no batching, each
        operation in a transaction of its own, at once, as before batching)."""
        super().__init__(path)
        self._clock = clock
        self._batcher = Batcher(inline=self._inline, threaded=self._run,
                                alone=self._run_alone, now=self._now_us,
                                max_batch=max_batch)
        # Refunds of permits admitted for callers that were cancelled meanwhile.
        self._orphans: set[asyncio.Future[object]] = set()
        self._key_tables = False
        """Whether the file holds the key store's tables (admission re-checks keys)."""
        self._granted: dict[str, tuple[AdmissionRequest, int]] = {}
        """Permits this store granted and has not settled yet: their request and admission
        time, so a settlement need not read and decode them again. Only a hint: a
        settlement claims its permit with ``status = 'pending'`` in its UPDATE, and any
        miss (another process settled it, the admission rolled back) takes the full path."""

    async def _run_alone(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._run(fn, inline=True)

    def _now_us(self) -> int:
        return (self._clock() - _EPOCH) // timedelta(microseconds=1)

    # -- admission ---------------------------------------------------------------------

    async def admit(self, requests: list[AdmissionRequest]) -> list[Permit | Refusal]:
        for req in requests:
            validate_request(req)

        def _admit(conn: sqlite3.Connection, batch: Batch) -> list[Permit | Refusal]:
            return [self._admit_one(conn, batch, req) for req in requests]
        decided: list[Permit | Refusal] = await self._batcher.run(
            _admit, orphan=self._refund)
        return decided

    def _track(self, future: asyncio.Future[Any]) -> None:
        self._orphans.add(future)
        future.add_done_callback(self._orphans.discard)

    def _refund(self, decided: list[Permit | Refusal]) -> None:
        """Settle CANCELLED the permits of an admission whose caller was cancelled, so
        they never bind the limits (nobody will dispatch or settle them)."""
        for result in decided:
            if isinstance(result, Permit):
                outcome = Outcome(kind=OutcomeKind.CANCELLED,
                                  detail="caller cancelled during admission")
                self._track(asyncio.ensure_future(
                    self.settle(result.id, settlement_for(result.request, outcome))))

    async def drain(self) -> None:
        """Wait for every queued admission and settlement, and for the refunds of
        admissions whose callers were cancelled."""
        await self._batcher.idle()
        while self._orphans:
            await asyncio.gather(*list(self._orphans), return_exceptions=True)
            await self._batcher.idle()

    async def close(self) -> None:
        await self.drain()
        b = self._batcher
        if b.transactions:
            log.info("local governance store %s: %d admissions and settlements in %d "
                     "transactions", self.path, b.operations, b.transactions)
        await super().close()

    def _admit_one(self, conn: sqlite3.Connection, batch: Batch,
                   req: AdmissionRequest) -> Permit | Refusal:
        if not self._key_tables:  # asked until they exist (the key store may open later)
            self._key_tables = has_key_tables(conn)
        stale = snapshot_refusal(conn, req, self._clock()) if self._key_tables else None
        if stale is not None:
            return stale
        # Decide on every charge before writing any: all-or-none without savepoints.
        updates: list[tuple[Charge, CounterState]] = []
        for charge in req.charges:
            decided = reserve(charge, batch.load(conn, charge), batch.now)
            if isinstance(decided, Refusal):
                return decided
            updates.append((charge, decided))
        for _, state in updates:
            batch.store(state)
        permit = Permit(id=permit_id(), request=req,
                        buckets={c.counter: s.balance for c, s in updates
                                 if c.kind == "bucket"})
        _insert_permit(conn, permit, batch.now)
        if len(self._granted) >= _MAX_GRANTED:  # never settled here (a bug): drop hints
            self._granted.clear()
        self._granted[permit.id] = (req, batch.now)
        return permit

    # -- settlement --------------------------------------------------------------------

    async def settle(self, permit_id: str, settlement: Settlement) -> SettleResult:
        fingerprint = settlement_fingerprint(settlement)

        status = "invalid" if settlement.kind is OutcomeKind.INVALID else "settled"

        def _settle(conn: sqlite3.Connection, batch: Batch) -> SettleResult:
            # Everything that can refuse is checked before the first write (_localbatch).
            claimed = self._claim(conn, permit_id, settlement, status)
            if claimed is None:
                row = _SQL["permit_to_settle"].execute(conn, {"id": permit_id}).fetchone()
                if row is None:
                    raise UnknownPermit(
                        f"permit {permit_id!r} was never admitted by this store")
                if row["status"] != "pending":  # settled: its settlement row says how
                    done = _SQL["settlement"].execute(conn, {"permit_id": permit_id}).fetchone()
                    return _replay(permit_id, done, settlement, fingerprint)
                req = msgspec.json.decode(row["request"], type=AdmissionRequest)
                check_settlement(req, settlement)
                created_us = row["created_us"]
                _SQL["set_permit_status"].execute(conn, {"id": permit_id, "status": status})
            else:
                req, created_us = claimed
            now = batch.now
            s = settlement
            if s.kind is OutcomeKind.INVALID:
                _freeze(conn, batch, permit_id, req)
            else:
                parts = []
                for seq, charge in enumerate(req.charges):
                    committed = s.commits[charge.counter]
                    liability = s.liabilities.get(charge.counter, 0)
                    batch.store(settle_counter(charge, batch.load(conn, charge), committed,
                                               liability, now, created_us))
                    parts.append((committed, liability, permit_id, seq))
                _SETTLE_CHARGE.executemany_values(conn, parts)
            _INSERT_SETTLEMENT.execute_values(
                conn, permit_id, str(s.kind), fingerprint, clamp(s.tokens_committed),
                clamp(s.usd_committed), s.detail, now, clamp(s.tokens_liability),
                clamp(s.usd_liability), int(s.bound_exceeded))
            _insert_facts(conn, permit_id, s)
            return _result(permit_id, s, replay=False)
        result: SettleResult = await self._batcher.run(_settle, retry_alone=True)
        return result

    def _claim(self, conn: sqlite3.Connection, permit_id: str, settlement: Settlement,
               status: str) -> tuple[AdmissionRequest, int] | None:
        """A permit this store granted, claimed for ``settlement`` without reading it back:
        its request and admission time, its row already marked ``status``. None (nothing
        written) when there is no hint, the settlement does not fit its request, or the
        row is no longer pending: the caller reads the row and decides as it always did
        (replay, conflict, unknown permit, the same refusal words)."""
        hint = self._granted.pop(permit_id, None)
        if hint is None:
            return None
        try:
            check_settlement(hint[0], settlement)
        except InvalidUsage:
            return None
        cur = _CLAIM_PERMIT.execute_values(conn, status, permit_id)
        return hint if cur.rowcount == 1 else None

    async def resolve(self, permit_id: str, settlement: Settlement) -> SettleResult:
        """Replace an uncertain or tokens-known permit's liability by an exact figure; a
        pending permit is simply settled with it. Windows move the permit's part from
        liability to committed; buckets are left alone (their minute has passed)."""
        def _pending(conn: sqlite3.Connection) -> bool:
            row = _SQL["permit_status"].execute(conn, {"id": permit_id}).fetchone()
            if row is None:
                raise UnknownPermit(f"permit {permit_id!r} was never admitted by this store")
            return bool(row["status"] == "pending")
        if await self._run(_pending, write=False):
            return await self.settle(permit_id, settlement)
        fingerprint = settlement_fingerprint(settlement)

        def _resolve(conn: sqlite3.Connection) -> SettleResult:
            row = _SQL["settled_permit"].execute(conn, {"id": permit_id}).fetchone()
            if row["kind"] not in (OutcomeKind.UNCERTAIN, OutcomeKind.TOKENS_KNOWN):
                raise SettlementConflict(
                    f"permit {permit_id} was settled as {row['kind']}: only an uncertain or "
                    "tokens-known permit has a liability to resolve")
            req = msgspec.json.decode(row["request"], type=AdmissionRequest)
            check_settlement(req, settlement)
            now = self._now_us()
            for seq, charge in enumerate(req.charges):
                if charge.kind == "bucket":
                    continue
                old = _SQL["charge_figures"].execute(
                    conn, {"permit_id": permit_id, "seq": seq}).fetchone()
                new = settlement.commits[charge.counter]
                liability = settlement.liabilities.get(charge.counter, 0)
                state = resolve_counter(load_counter(conn, charge, now),
                                        new - (old["committed"] or 0),
                                        liability - (old["liability"] or 0))
                store_counter(conn, state)
                _SETTLE_CHARGE.execute_values(conn, new, liability, permit_id, seq)
            s = settlement
            _SQL["resolve_settlement"].execute(conn, {
                "permit_id": permit_id, "kind": str(s.kind), "fingerprint": fingerprint,
                "tokens_committed": clamp(s.tokens_committed),
                "usd_committed": clamp(s.usd_committed),
                "tokens_liability": clamp(s.tokens_liability),
                "usd_liability": clamp(s.usd_liability),
                "bound_exceeded": int(s.bound_exceeded), "detail": s.detail,
                "resolved_us": now})
            return _result(permit_id, s, replay=False)
        return await self._run(_resolve)

    # -- reading -----------------------------------------------------------------------

    async def current_generation(self) -> int:
        # Local policy generations are compared by the gateway itself, not the store.
        return 0

    async def usage(self, *, day: str, month: str, key_id: str | None = None,
                    team_id: str | None = None) -> list[UsageRow]:
        def _usage(conn: sqlite3.Connection) -> list[UsageRow]:
            return usage_rows(conn, day=day, month=month, key_id=key_id, team_id=team_id)
        return await self._run(_usage, write=False)

    async def figures(self, charges: list[Charge]) -> dict[str, StoredFigures]:
        def _read(conn: sqlite3.Connection) -> dict[str, StoredFigures]:
            now = self._now_us()
            out: dict[str, StoredFigures] = {}
            for c in charges:
                state = load_counter(conn, c, now)
                balance = (refill(state.balance, c.limit or 0, now - state.updated_us)
                           if c.kind == "bucket" else None)
                out[c.counter] = StoredFigures(
                    now_us=now, balance=balance, reserved=state.reserved,
                    committed=state.committed, liability=state.liability,
                    frozen=state.frozen_by is not None)
            return out
        return await self._run(_read, write=False)

    async def counter(self, name: str) -> CounterState | None:
        """A counter as stored (buckets not refilled to now), or None if never charged."""
        def _get(conn: sqlite3.Connection) -> CounterState | None:
            return read_counter(conn, name)
        return await self._run(_get, write=False)

    async def pending_permits(self) -> list[str]:
        """Ids of permits admitted and not yet settled (they keep binding the limits)."""
        def _pending(conn: sqlite3.Connection) -> list[str]:
            return [r["id"] for r in _SQL["pending_permits"].execute(conn)]
        return await self._run(_pending, write=False)

    async def get_permit(self, permit_id: str) -> Permit | None:
        """The permit and its AdmissionRequest (pending or settled), or None if unknown."""
        def _get(conn: sqlite3.Connection) -> Permit | None:
            return local_get_permit(conn, permit_id)
        return await self._run(_get, write=False)

    async def permit_info(self, permit_id: str) -> PermitInfo | None:
        """One permit's operator view (status, bounds, settlement), or None if unknown."""
        def _info(conn: sqlite3.Connection) -> PermitInfo | None:
            return local_permit_info(conn, permit_id, self._now_us())
        return await self._run(_info, write=False)

    async def permits(self, *, pending_only: bool = False, older_than_s: int | None = None,
                      limit: int | None = None) -> list[PermitInfo]:
        """Permits oldest first (operators: what crashed gateways left pending)."""
        def _list(conn: sqlite3.Connection) -> list[PermitInfo]:
            return local_permits(conn, self._now_us(), pending_only=pending_only,
                                 older_than_s=older_than_s, limit=limit)
        return await self._run(_list, write=False)

    async def last_used(self, key_ids: list[str]) -> dict[str, datetime]:
        """As :meth:`PostgresGovernanceStore.last_used`."""
        def _read(conn: sqlite3.Connection) -> dict[str, datetime]:
            found = {}
            for key_id in key_ids:
                row = _SQL["key_last_used"].execute(conn, {"key_id": key_id}).fetchone()
                if row["last_us"] is not None:
                    found[key_id] = _EPOCH + timedelta(microseconds=row["last_us"])
            return found
        return await self._run(_read, write=False)

    async def prune_permits(self, *, before: datetime, month: str, limit: int) -> int:
        """Request-log retention: as :meth:`PostgresGovernanceStore.prune_permits`."""
        before_us = (before - _EPOCH) // timedelta(microseconds=1)

        def _prune(conn: sqlite3.Connection) -> int:
            ids = [(r["id"],) for r in _SQL["prunable_permits"].execute(
                conn, {"before_us": before_us, "month": month, "limit": limit})]
            for name in ("prune_charges", "prune_settlement", "prune_facts", "prune_tier",
                         "prune_permit"):
                _SQL[name].executemany(conn, ({"id": i} for (i,) in ids))
            return len(ids)
        return await self._run(_prune)

    async def request_log(self, f: LogFilter, *, limit: int | None) -> list[PermitInfo]:
        """Permits newest first, filtered (the request log)."""
        def _list(conn: sqlite3.Connection) -> list[PermitInfo]:
            return local_request_log(conn, self._now_us(), f, limit)
        return await self._run(_list, write=False)

    async def request_summary(self, f: LogFilter, *, groups: tuple[str, ...],
                              bucket: str) -> list[SummaryFigures]:
        """The request log summed per group and UTC period, in one statement."""
        def _sum(conn: sqlite3.Connection) -> list[SummaryFigures]:
            return local_request_summary(conn, f, groups, bucket)
        return await self._run(_sum, write=False)

    async def frozen(self) -> list[FrozenCounter]:
        """Counters frozen by invalid usage, with the permit that froze each."""
        return await self._run(local_frozen, write=False)

    async def note_tier(self, permit_id: str, tier: str) -> None:
        """The request log's tier of a permit (``routing.soft_tier``), once."""
        def _note(conn: sqlite3.Connection) -> None:
            _SQL["insert_permit_tier"].execute(conn, {"permit_id": permit_id, "tier": tier})
        await self._run(_note, inline=True)

    async def unfreeze(self, name: str) -> bool:
        """Operator action: lift a freeze after investigating the invalid usage."""
        def _unfreeze(conn: sqlite3.Connection) -> bool:
            cur = _SQL["unfreeze_counter"].execute(conn, {"counter": name})
            return cur.rowcount == 1
        return await self._run(_unfreeze)


def permit_id() -> str:
    """A new permit id: 32 hex digits of a UUIDv7 (RFC 9562: 48 bits of Unix time in ms,
    then 74 random bits), so ids made close in time sort close together. The permit,
    charge and settlement tables are keyed by it: with random (v4) ids every insert
    dirtied its own leaf page of each of those three indexes, which each commit then
    wrote to the WAL; time-ordered ones land on the same few rightmost pages."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")  # 80 bits; 74 used
    value = ((ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | (rand >> 68 & 0xFFF) << 64
             | 0b10 << 62 | rand & 0x3FFF_FFFF_FFFF_FFFF)
    return f"{value:032x}"


def _insert_permit(conn: sqlite3.Connection, permit: Permit, now: int) -> None:
    req = permit.request
    _INSERT_PERMIT.execute_values(
        conn, permit.id, req.request_id, req.key_id, req.team_id, req.user, req.model,
        req.day, req.month, clamp(req.token_bound), clamp(req.usd_bound),
        msgspec.json.encode(req), now)
    _INSERT_CHARGE.executemany_values(conn, [
        (permit.id, seq, c.counter, c.kind, c.dimension, c.amount, c.limit, c.window,
         c.rule_uid, int(c.hard)) for seq, c in enumerate(req.charges)])


def _result(permit_id: str, s: Settlement, *, replay: bool) -> SettleResult:
    return SettleResult(permit_id=permit_id, kind=s.kind,
                        tokens_committed=s.tokens_committed, usd_committed=s.usd_committed,
                        tokens_liability=s.tokens_liability, usd_liability=s.usd_liability,
                        bound_exceeded=s.bound_exceeded, replay=replay)


def _replay(permit_id: str, done: sqlite3.Row, settlement: Settlement,
            fingerprint: str) -> SettleResult:
    if done["fingerprint"] != fingerprint:
        raise SettlementConflict(
            f"permit {permit_id} was already settled as {done['kind']}; a different "
            f"outcome ({settlement.kind}) is refused")
    return SettleResult(permit_id=permit_id, kind=OutcomeKind(done["kind"]),
                        tokens_committed=done["tokens_committed"],
                        usd_committed=done["usd_committed"],
                        tokens_liability=done["tokens_liability"],
                        usd_liability=done["usd_liability"],
                        bound_exceeded=bool(done["bound_exceeded"]), replay=True)


def _freeze(conn: sqlite3.Connection, batch: Batch, permit_id: str,
            req: AdmissionRequest) -> None:
    """Invalid usage: every money window/account it charged freezes and no other counter
    moves, except that its in-flight slots are freed (the request is over)."""
    for charge in req.charges:
        if charge.kind != "bucket" and charge.dimension == "usd":
            batch.freeze(conn, charge.counter, permit_id)
        elif is_slot(charge):
            batch.store(settle_counter(charge, batch.load(conn, charge), 0, 0, batch.now,
                                       batch.now))
