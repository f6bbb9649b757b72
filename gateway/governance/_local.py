"""The local-profile governance store: counters, permits and settlements in SQLite.

One replica, one file. Each :meth:`LocalGovernanceStore.admit` call is one
``BEGIN IMMEDIATE`` transaction: the write lock is taken before the first read, so the
counters a decision reads cannot change before it writes. The arithmetic is the shared
pure code in :mod:`gateway.governance._plan`; only the atomicity is local. Everything is
persisted, so a restart loses no committed spend and forgets no pending permit (pending
permits keep their reservations, which keep binding the limits).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import replace as _replace
from datetime import UTC, datetime, timedelta

import msgspec

from gateway.errors import BadRequest, SettlementConflict, UnknownPermit
from gateway.governance._model import (
    BUCKET_SCALE,
    AdmissionRequest,
    Charge,
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
    SettleResult,
    UsageRow,
)
from gateway.governance._plan import (
    bucket_admits,
    bucket_settle,
    refill,
    retry_after_seconds,
    settled_amounts,
)
from gateway.governance._usage import usage_rows
from gateway.keys._sqlite import SqliteBase
from gateway.pricing import InvalidUsage

_SCHEMA = """
CREATE TABLE IF NOT EXISTS gov_counters (
    counter TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    dimension TEXT NOT NULL,
    balance INTEGER NOT NULL DEFAULT 0,      -- buckets: scaled units (BUCKET_SCALE)
    updated_us INTEGER NOT NULL DEFAULT 0,   -- buckets: last refill, µs since the epoch
    reserved INTEGER NOT NULL DEFAULT 0,     -- windows/accounts
    committed INTEGER NOT NULL DEFAULT 0,    -- windows/accounts
    frozen_by TEXT                           -- permit whose invalid usage froze it
);
CREATE TABLE IF NOT EXISTS gov_permits (
    id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL,
    key_id TEXT NOT NULL, team_id TEXT NOT NULL, user TEXT,
    model TEXT NOT NULL,
    day TEXT NOT NULL, month TEXT NOT NULL,
    token_bound INTEGER NOT NULL, usd_bound INTEGER NOT NULL,
    request BLOB NOT NULL,                   -- the AdmissionRequest, msgspec JSON
    status TEXT NOT NULL,                    -- pending | settled | invalid
    created_us INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS gov_permits_day ON gov_permits(day);
CREATE INDEX IF NOT EXISTS gov_permits_month ON gov_permits(month);
CREATE TABLE IF NOT EXISTS gov_charges (
    permit_id TEXT NOT NULL REFERENCES gov_permits(id),
    seq INTEGER NOT NULL,
    counter TEXT NOT NULL, kind TEXT NOT NULL, dimension TEXT NOT NULL,
    amount INTEGER NOT NULL, "limit" INTEGER, window TEXT, rule_uid TEXT,
    hard INTEGER NOT NULL,
    committed INTEGER,                       -- set by settlement (NULL: pending/invalid)
    PRIMARY KEY (permit_id, seq)
);
CREATE TABLE IF NOT EXISTS gov_settlements (
    permit_id TEXT PRIMARY KEY REFERENCES gov_permits(id),
    kind TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    tokens_committed INTEGER NOT NULL,
    usd_committed INTEGER NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    settled_us INTEGER NOT NULL
);
"""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Stored values stay inside SQLite's signed 64-bit INTEGER: balances and sums saturate
# here (ADR-039: positive accumulations saturate) instead of overflowing.
_SATURATE = 1 << 62
# Input ceilings: a bucket's capacity * BUCKET_SCALE must fit (2**36 * 2**26 = 2**62);
# amounts far above any real request are caller bugs, refused before any counter moves.
MAX_BUCKET_CAPACITY = 1 << 36
MAX_AMOUNT = 1 << 50


@dataclass(frozen=True, slots=True)
class CounterState:
    """One counter as stored (for operators, response headers and tests)."""

    counter: str
    kind: str
    dimension: str
    balance: int
    updated_us: int
    reserved: int
    committed: int
    frozen_by: str | None


def _clamp(value: int) -> int:
    return max(-_SATURATE, min(_SATURATE, value))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate(req: AdmissionRequest) -> None:
    """Refuse plans whose numbers could not be stored exactly (a caller bug)."""
    for i, c in enumerate(req.charges):
        where = f"charges[{i}] ({c.counter})"
        if not _is_int(c.amount) or not 0 <= c.amount <= MAX_AMOUNT:
            raise BadRequest(f"{where}.amount: must be an integer in 0..{MAX_AMOUNT}")
        if c.limit is not None and (not _is_int(c.limit) or c.limit < 0):
            raise BadRequest(f"{where}.limit: must be a non-negative integer")
        if c.kind == "bucket" and c.limit is not None and c.limit > MAX_BUCKET_CAPACITY:
            raise BadRequest(f"{where}.limit: bucket capacity above {MAX_BUCKET_CAPACITY}")
        if c.kind in ("window", "account") and c.limit is not None and c.limit > MAX_AMOUNT:
            raise BadRequest(f"{where}.limit: above {MAX_AMOUNT}")
    if len({c.counter for c in req.charges}) != len(req.charges):
        raise BadRequest(f"request {req.request_id}: a counter is charged twice")


def _fingerprint(kind: OutcomeKind, commits: dict[str, int]) -> str:
    body = json.dumps([str(kind), sorted(commits.items())], separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def _status(charge: Charge) -> int:
    return 402 if charge.dimension == "usd" else 429


class LocalGovernanceStore(SqliteBase):
    """:class:`gateway.governance.GovernanceStore` on a SQLite file (one replica)."""

    def __init__(self, path: str, *,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        super().__init__(path)
        self._clock = clock

    def _schema(self) -> str:
        return _SCHEMA

    def _now_us(self) -> int:
        return (self._clock() - _EPOCH) // timedelta(microseconds=1)

    # -- admission ---------------------------------------------------------------------

    async def admit(self, requests: list[AdmissionRequest]) -> list[Permit | Refusal]:
        for req in requests:
            _validate(req)

        def _admit(conn: sqlite3.Connection) -> list[Permit | Refusal]:
            now = self._now_us()
            return [self._admit_one(conn, req, now) for req in requests]
        return await self._run(_admit)

    def _admit_one(self, conn: sqlite3.Connection, req: AdmissionRequest,
                   now: int) -> Permit | Refusal:
        # Decide on every charge before writing any: all-or-none without savepoints.
        updates: list[tuple[Charge, CounterState]] = []
        for charge in req.charges:
            state = _load(conn, charge, now)
            decided = _reserve(charge, state, now)
            if isinstance(decided, Refusal):
                return decided
            updates.append((charge, decided))
        for _, state in updates:
            _store(conn, state)
        permit = Permit(id=uuid.uuid4().hex, request=req)
        _insert_permit(conn, permit, now)
        return permit

    # -- settlement --------------------------------------------------------------------

    async def settle(self, permit_id: str, outcome: Outcome,
                     commits: dict[str, int]) -> SettleResult:
        fingerprint = _fingerprint(outcome.kind, commits)

        def _settle(conn: sqlite3.Connection) -> SettleResult:
            row = conn.execute("SELECT request FROM gov_permits WHERE id = ?",
                               (permit_id,)).fetchone()
            if row is None:
                raise UnknownPermit(f"permit {permit_id!r} was never admitted by this store")
            done = conn.execute("SELECT * FROM gov_settlements WHERE permit_id = ?",
                                (permit_id,)).fetchone()
            if done is not None:
                return _replay(permit_id, done, outcome, fingerprint)
            req = msgspec.json.decode(row["request"], type=AdmissionRequest)
            now = self._now_us()
            if outcome.kind is OutcomeKind.INVALID:
                tokens = usd = 0
                _freeze(conn, permit_id, req)
                status = "invalid"
            else:
                _check_commits(req, commits)
                tokens, usd = settled_amounts(req, outcome)
                for seq, charge in enumerate(req.charges):
                    _commit(conn, permit_id, seq, charge, commits[charge.counter], now)
                status = "settled"
            conn.execute("UPDATE gov_permits SET status = ? WHERE id = ?", (status, permit_id))
            conn.execute("INSERT INTO gov_settlements (permit_id, kind, fingerprint,"
                         " tokens_committed, usd_committed, detail, settled_us)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (permit_id, str(outcome.kind), fingerprint, _clamp(tokens),
                          _clamp(usd), outcome.detail, now))
            return SettleResult(permit_id=permit_id, kind=outcome.kind,
                                tokens_committed=tokens, usd_committed=usd)
        return await self._run(_settle)

    # -- reading -----------------------------------------------------------------------

    async def current_generation(self) -> int:
        # Local policy generations are compared by the gateway itself, not the store.
        return 0

    async def usage(self, *, day: str, month: str, key_id: str | None = None,
                    team_id: str | None = None) -> list[UsageRow]:
        def _usage(conn: sqlite3.Connection) -> list[UsageRow]:
            return usage_rows(conn, day=day, month=month, key_id=key_id, team_id=team_id)
        return await self._run(_usage, write=False)

    async def counter(self, name: str) -> CounterState | None:
        """A counter as stored (buckets not refilled to now), or None if never charged."""
        def _get(conn: sqlite3.Connection) -> CounterState | None:
            row = conn.execute("SELECT * FROM gov_counters WHERE counter = ?",
                               (name,)).fetchone()
            return None if row is None else CounterState(**dict(row))
        return await self._run(_get, write=False)

    async def pending_permits(self) -> list[str]:
        """Ids of permits admitted and not yet settled (they keep binding the limits)."""
        def _pending(conn: sqlite3.Connection) -> list[str]:
            return [r["id"] for r in conn.execute(
                "SELECT id FROM gov_permits WHERE status = 'pending' ORDER BY created_us")]
        return await self._run(_pending, write=False)

    async def unfreeze(self, name: str) -> bool:
        """Operator action: lift a freeze after investigating the invalid usage."""
        def _unfreeze(conn: sqlite3.Connection) -> bool:
            cur = conn.execute("UPDATE gov_counters SET frozen_by = NULL WHERE counter = ?"
                               " AND frozen_by IS NOT NULL", (name,))
            return cur.rowcount == 1
        return await self._run(_unfreeze)


def _load(conn: sqlite3.Connection, charge: Charge, now: int) -> CounterState:
    row = conn.execute("SELECT * FROM gov_counters WHERE counter = ?",
                       (charge.counter,)).fetchone()
    if row is not None:
        return CounterState(**dict(row))
    # A bucket is born full; a window or account is born empty.
    full = (charge.limit or 0) * BUCKET_SCALE if charge.kind == "bucket" else 0
    return CounterState(counter=charge.counter, kind=charge.kind, dimension=charge.dimension,
                        balance=full, updated_us=now, reserved=0, committed=0, frozen_by=None)


def _refilled(state: CounterState, capacity: int, now: int) -> tuple[int, int]:
    """(balance refilled to ``now`` and capped at the captured capacity, new timestamp).

    A clock that steps backwards refills nothing and never rewinds the timestamp, so no
    interval is ever refilled twice.
    """
    balance = refill(state.balance, capacity, now - state.updated_us)
    return min(balance, capacity * BUCKET_SCALE), max(now, state.updated_us)


def _reserve(charge: Charge, state: CounterState, now: int) -> CounterState | Refusal:
    if charge.kind == "bucket":
        if not charge.limit:
            return state
        balance, stamp = _refilled(state, charge.limit, now)
        if not bucket_admits(balance, charge.limit, charge.amount):
            return Refusal(
                status=_status(charge), counter=charge.counter,
                reason=f"{charge.counter}: {charge.dimension} per minute limit "
                       f"{charge.limit} exhausted",
                retry_after=retry_after_seconds(balance, charge.limit, charge.amount))
        return _replace(state, balance=_clamp(balance - charge.amount * BUCKET_SCALE),
                        updated_us=stamp)
    if state.frozen_by is not None:
        return Refusal(status=_status(charge), counter=charge.counter,
                       reason=f"{charge.counter}: account is frozen after invalid usage was "
                              f"reported for permit {state.frozen_by}; an operator must "
                              "resolve it")
    wanted = state.committed + state.reserved + charge.amount
    if charge.limit is not None and charge.hard and wanted > charge.limit:
        unit = "µUSD" if charge.dimension == "usd" else charge.dimension
        return Refusal(status=_status(charge), counter=charge.counter,
                       reason=f"{charge.counter}: limit {charge.limit} {unit} would be "
                              f"exceeded (committed {state.committed} + reserved "
                              f"{state.reserved} + this request {charge.amount})")
    return _replace(state, reserved=_clamp(state.reserved + charge.amount))


def _store(conn: sqlite3.Connection, s: CounterState) -> None:
    conn.execute(
        "INSERT INTO gov_counters (counter, kind, dimension, balance, updated_us, reserved,"
        " committed, frozen_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (counter) DO UPDATE SET balance = excluded.balance,"
        " updated_us = excluded.updated_us, reserved = excluded.reserved,"
        " committed = excluded.committed, frozen_by = excluded.frozen_by",
        (s.counter, s.kind, s.dimension, s.balance, s.updated_us, s.reserved, s.committed,
         s.frozen_by))


def _insert_permit(conn: sqlite3.Connection, permit: Permit, now: int) -> None:
    req = permit.request
    conn.execute(
        "INSERT INTO gov_permits (id, request_id, key_id, team_id, user, model, day, month,"
        " token_bound, usd_bound, request, status, created_us)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?)",
        (permit.id, req.request_id, req.key_id, req.team_id, req.user, req.model, req.day,
         req.month, _clamp(req.token_bound), _clamp(req.usd_bound),
         msgspec.json.encode(req), now))
    conn.executemany(
        'INSERT INTO gov_charges (permit_id, seq, counter, kind, dimension, amount, "limit",'
        " window, rule_uid, hard) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(permit.id, seq, c.counter, c.kind, c.dimension, c.amount, c.limit, c.window,
          c.rule_uid, int(c.hard)) for seq, c in enumerate(req.charges)])


def _replay(permit_id: str, done: sqlite3.Row, outcome: Outcome,
            fingerprint: str) -> SettleResult:
    if done["fingerprint"] != fingerprint:
        raise SettlementConflict(
            f"permit {permit_id} was already settled as {done['kind']}; a different "
            f"outcome ({outcome.kind}) is refused")
    return SettleResult(permit_id=permit_id, kind=OutcomeKind(done["kind"]),
                        tokens_committed=done["tokens_committed"],
                        usd_committed=done["usd_committed"], replay=True)


def _check_commits(req: AdmissionRequest, commits: dict[str, int]) -> None:
    charged = {c.counter for c in req.charges}
    for name in sorted(charged - commits.keys()):
        raise InvalidUsage(f"commits[{name!r}]: missing for a charged counter")
    for name in sorted(commits.keys() - charged):
        raise InvalidUsage(f"commits[{name!r}]: this permit did not charge that counter")
    for name, value in commits.items():
        if not _is_int(value) or not 0 <= value <= MAX_AMOUNT:
            raise InvalidUsage(f"commits[{name!r}]: must be an integer in 0..{MAX_AMOUNT}, "
                               f"got {value!r}")


def _commit(conn: sqlite3.Connection, permit_id: str, seq: int, charge: Charge,
            committed: int, now: int) -> None:
    state = _load(conn, charge, now)
    if charge.kind == "bucket":
        if charge.limit:
            balance, stamp = _refilled(state, charge.limit, now)
            balance = bucket_settle(balance, charge.limit, charge.amount, committed)
            state = _replace(state, balance=_clamp(balance), updated_us=stamp)
    else:
        state = _replace(state, reserved=_clamp(state.reserved - charge.amount),
                         committed=_clamp(state.committed + committed))
    _store(conn, state)
    conn.execute("UPDATE gov_charges SET committed = ? WHERE permit_id = ? AND seq = ?",
                 (committed, permit_id, seq))


def _freeze(conn: sqlite3.Connection, permit_id: str, req: AdmissionRequest) -> None:
    """Invalid usage: no counter moves; every money window/account it charged freezes."""
    for charge in req.charges:
        if charge.kind != "bucket" and charge.dimension == "usd":
            conn.execute("UPDATE gov_counters SET frozen_by = ? WHERE counter = ?"
                         " AND frozen_by IS NULL", (permit_id, charge.counter))
