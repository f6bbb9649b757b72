"""``mayu keys import``'s spend: the open month's permits and what they charged.

A cutover from the local profile must not grant a budget twice, so the import carries
the open windows' spend into the shared store with the teams and keys, in the same
Postgres transaction (:func:`import_cutover`; the keys half is
:func:`gateway.keys._import.copy_records`). The unit it moves is the
**permit**, not the counter: every local permit admitted in the open UTC month (which
holds every permit of the open day) is copied with its id, its figures and its segments,
and only the permits that were not there yet add their segments' committed and
liability to the Postgres counters and accounts (``import_permits`` returns the ids it
inserted). So:

- a Postgres counter ends as its own spend (shared traffic before the import) plus the
  local spend, each local permit counted exactly once however often the import runs
  (the permit id is the record of what was imported; a permit there already with other
  figures is a conflict and nothing is imported);
- the shared profile's request log and ``/v1/usage`` (read from permits) agree with its
  counters, as they do for its own traffic;
- every calendar window (key, team and rule; µUSD and tokens) and policy account those
  permits charged is moved: the open day's and month's, and the closed days of the open
  month (nothing admits against those; their counters just stay consistent with the
  permits). Buckets (RPM/TPM) and in-flight slots are not moved: they refill within a
  minute and hold nothing once the local gateway is stopped.

Before moving anything the permits are checked against the local counters: each calendar
window and account must hold exactly what its permits committed, left as liability and
(invalid permits) still reserve, else the import is refused, so the remaining budget after
the cutover is the one before.

"Open" is the UTC month of the importing host's clock when the import starts. A window
that closes during the cutover needs nothing: if the month turned before the import ran,
the new month starts empty on both sides and nothing is moved; if it turns after, the
moved windows are closed ones no admission reads.

A **pending** permit (the local gateway still running, or crashed) is refused
(:class:`PendingPermits`, exit 2): its outcome is unknown, and guessing one would either
drop a reservation or charge it twice. Stop the gateway (it settles what it can at
shutdown), then ``mayu permits resolve`` what is left. An **invalid** permit keeps its
bound reserved and its money counters frozen in both stores: it is moved as it is.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
from psycopg import AsyncConnection, Rollback
from psycopg.types.json import Jsonb

import sql
from gateway.db import Pool, connection, fetch_all
from gateway.errors import InferplaneError, NotFound
from gateway.governance._counterkey import CounterKey
from gateway.governance._model import AdmissionRequest, Charge
from gateway.keys import ImportReport, KeyRecord, People, Team, copy_records

_CHUNK = 2_000
"""Permits per statement: bounded parameters, and a progress line per chunk."""


class PendingPermits(InferplaneError, status=409, code="pending_permits"):
    """The local store still holds pending permits; nothing was imported."""


class SpendMismatch(InferplaneError, status=409, code="spend_mismatch"):
    """A local counter does not hold what its permits charged; nothing was imported."""


class PermitConflict(InferplaneError, status=409, code="import_conflict"):
    """The destination holds a permit of the same id with other figures; nothing was
    imported."""


class WindowSpend(msgspec.Struct, frozen=True, kw_only=True):
    """A team's moved µUSD in one window: committed, liability, and the bounds invalid
    permits keep reserved."""

    committed: int = 0
    liability: int = 0
    reserved: int = 0


class TeamSpend(msgspec.Struct, frozen=True, kw_only=True):
    team_id: str
    name: str
    day: WindowSpend
    month: WindowSpend


class SpendReport(msgspec.Struct, frozen=True, kw_only=True):
    """What the import moved (a retry moves nothing: all ``permits_unchanged``)."""

    day: str
    month: str
    permits_added: int
    permits_unchanged: int
    invalid_permits: int
    """Of ``permits_added``: invalid ones (their bound stays reserved, counters frozen)."""
    counters_changed: int
    """Calendar windows and policy accounts whose figures grew."""
    teams: list[TeamSpend]


@dataclass(frozen=True)
class _Segment:
    """One counter a permit charged (a counter charged twice by one permit: summed)."""

    charge: Charge
    amount: int
    committed: int | None
    liability: int | None

    def row(self, permit_id: str) -> dict[str, Any]:
        c = self.charge
        return {"permit_id": permit_id, "counter": c.counter, "kind": c.kind,
                "dimension": c.dimension, "amount": self.amount, "limit": c.limit,
                "window": c.window, "rule_uid": c.rule_uid, "hard": c.hard,
                "committed": self.committed, "liability": self.liability}


@dataclass(frozen=True)
class _Permit:
    row: dict[str, Any]
    """The permit as ``import_permits`` inserts it."""
    segments: list[_Segment]

    @property
    def id(self) -> str:
        return str(self.row["id"])

    @property
    def invalid(self) -> bool:
        return bool(self.row["status"] == "invalid")


@dataclass
class _Delta:
    """What a set of permits adds to one calendar window or account."""

    charge: Charge
    committed: int = 0
    liability: int = 0
    reserved: int = 0


@dataclass(frozen=True)
class LocalSpend:
    """The open month's permits of one local file, checked against its counters."""

    day: str
    month: str
    permits: list[_Permit] = field(default_factory=list)
    frozen: frozenset[str] = frozenset()
    """The local counters frozen by invalid usage."""


def _moved(charge: Charge) -> bool:
    """A calendar window (µUSD, tokens) or account, by its counter key: buckets and
    in-flight slots have no calendar period, and are not moved."""
    name = CounterKey.parse(charge.counter)
    return charge.kind != "bucket" and name is not None and name.window is not None


def _deltas(permits: list[_Permit]) -> dict[str, _Delta]:
    deltas: dict[str, _Delta] = {}
    for permit in permits:
        for seg in permit.segments:
            if not _moved(seg.charge):
                continue
            d = deltas.get(seg.charge.counter)
            if d is None:
                d = deltas[seg.charge.counter] = _Delta(seg.charge)
            d.charge = seg.charge  # the latest permit's limit, as admission would set it
            if permit.invalid:
                d.reserved += seg.amount
            else:
                d.committed += seg.committed or 0
                d.liability += seg.liability or 0
    return deltas


def _plus(a: int | None, b: int | None) -> int | None:
    """Two settlement figures of one counter summed (NULL: not settled, e.g. invalid)."""
    return None if a is None and b is None else (a or 0) + (b or 0)


def _segments(req: AdmissionRequest, figures: dict[int, tuple[int | None, int | None]]
              ) -> list[_Segment]:
    """The permit's charges with their settled figures, one per counter (Postgres keys
    segments by permit and counter; the local store by position)."""
    merged: dict[str, _Segment] = {}
    for seq, charge in enumerate(req.charges):
        committed, liability = figures.get(seq, (None, None))
        seen = merged.get(charge.counter)
        if seen is not None:
            merged[charge.counter] = _Segment(charge, seen.amount + charge.amount,
                                              _plus(seen.committed, committed),
                                              _plus(seen.liability, liability))
        else:
            merged[charge.counter] = _Segment(charge, charge.amount, committed, liability)
    return list(merged.values())


def _permit(row: sqlite3.Row, figures: dict[int, tuple[int | None, int | None]]) -> _Permit:
    req = msgspec.json.decode(row["request"], type=AdmissionRequest)
    pg = {"id": row["id"], "request_id": req.request_id, "key_id": req.key_id,
          "team_id": req.team_id, "user_name": req.user, "model": req.model,
          "token_bound": req.token_bound, "usd_bound": req.usd_bound,
          "generation": req.policy_generation, "day": req.day, "month": req.month,
          "status": row["kind"], "settle_fingerprint": row["fingerprint"],
          "detail": row["detail"], "tokens_committed": row["tokens_committed"],
          "usd_committed": row["usd_committed"], "tokens_liability": row["tokens_liability"],
          "usd_liability": row["usd_liability"], "bound_exceeded": bool(row["bound_exceeded"]),
          "admitted_us": row["created_us"], "settled_us": row["settled_us"],
          "resolved_us": row["resolved_us"]}
    return _Permit(pg, _segments(req, figures))


def _check(permits: list[_Permit], stored: dict[str, sqlite3.Row]) -> None:
    for counter, d in sorted(_deltas(permits).items()):
        row = stored.get(counter)
        held = (0, 0, 0) if row is None else (row["committed"], row["liability"],
                                               row["reserved"])
        if held != (d.committed, d.liability, d.reserved):
            raise SpendMismatch(
                f"local counter {counter} holds committed/liability/reserved "
                f"{'/'.join(map(str, held))} but the permits that charged it add up to "
                f"{d.committed}/{d.liability}/{d.reserved}; nothing was imported")


def read_spend(path: str, *, now: datetime | None = None) -> LocalSpend:
    """The open month's permits of the local governance file ``path`` (see the module
    docstring); refuses pending permits and counters their permits do not explain."""
    moment = now or datetime.now(UTC)
    day, month = moment.strftime("%Y-%m-%d"), moment.strftime("%Y-%m")
    if not Path(path).is_file():
        raise NotFound(f"--spend-from: {path} is not a file")
    conn = sqlite3.connect(path)  # only read (no schema run: a key-only file stays so)
    conn.row_factory = sqlite3.Row
    q = sql.local_governance
    try:
        if conn.execute(q["import_tables"]).fetchone()[0] < 4:
            return LocalSpend(day=day, month=month)
        pending = conn.execute(q["import_pending"]).fetchone()
        if pending["pending"]:
            raise PendingPermits(
                f"{path} holds {pending['pending']} pending permit(s) (the oldest "
                f"{pending['oldest']}): stop the local gateway, then settle them with "
                "`mayu permits resolve` (see `mayu permits list --pending`); nothing was "
                "imported")
        figures: dict[str, dict[int, tuple[int | None, int | None]]] = {}
        for g in conn.execute(q["import_charges"], {"month": month}):
            figures.setdefault(g["permit_id"], {})[g["seq"]] = (g["committed"],
                                                                 g["liability"])
        permits = [_permit(row, figures.get(row["id"], {}))
                   for row in conn.execute(q["import_permits"], {"month": month})]
        stored = {row["counter"]: row
                  for row in conn.execute(q["import_counters"], {"month": month})}
    finally:
        conn.close()
    _check(permits, stored)
    frozen = frozenset(c for c, row in stored.items() if row["frozen_by"] is not None)
    return LocalSpend(day=day, month=month, permits=permits, frozen=frozen)


def _chunks(permits: list[_Permit]) -> Iterator[list[_Permit]]:
    for i in range(0, len(permits), _CHUNK):
        yield permits[i:i + _CHUNK]


_COMPARED = ("request_id", "key_id", "team_id", "model", "day", "month", "status",
             "tokens_committed", "usd_committed", "tokens_liability", "usd_liability")


def _compare(ours: list[_Permit], theirs: list[dict[str, Any]]) -> None:
    by_id = {p.id: p for p in ours}
    for row in sorted(theirs, key=lambda r: str(r["id"])):
        mine = by_id[row["id"]].row
        diff = [k for k in _COMPARED if mine[k] != row[k]]
        if diff:
            raise PermitConflict(f"permit {row['id']}: differs in {', '.join(diff)} "
                                 "(settled or resolved again on one side since the last "
                                 "import?); nothing was imported")


def _team_spend(spend: LocalSpend, added: list[_Permit],
                names: dict[str, str]) -> list[TeamSpend]:
    sums: dict[str, list[list[int]]] = {}
    for p in added:
        day_month = sums.setdefault(p.row["team_id"], [[0, 0, 0], [0, 0, 0]])
        for window in ((0, 1) if p.row["day"] == spend.day else (1,)):
            if p.invalid:
                day_month[window][2] += p.row["usd_bound"]
            else:
                day_month[window][0] += p.row["usd_committed"] or 0
                day_month[window][1] += p.row["usd_liability"] or 0
    return sorted((TeamSpend(team_id=t, name=names.get(t, ""),
                             day=WindowSpend(committed=d[0], liability=d[1], reserved=d[2]),
                             month=WindowSpend(committed=m[0], liability=m[1],
                                               reserved=m[2]))
                   for t, (d, m) in sums.items()), key=lambda s: (s.name, s.team_id))


async def _apply(conn: AsyncConnection[Any], deltas: dict[str, _Delta],
                 frozen: frozenset[str]) -> int:
    accounts, windows = [], []
    for counter, d in sorted(deltas.items()):
        c = d.charge
        row = {"key": counter, "window": c.window, "limit": c.limit,
               "committed": d.committed, "liability": d.liability, "reserved": d.reserved,
               "frozen": counter in frozen}
        if c.kind == "account":
            name = CounterKey.parse(counter)
            scope = c.scope if c.scope is not None else (name.scope if name else None)
            accounts.append({**row, "rule_uid": c.rule_uid, "scope": scope, "hard": c.hard})
        else:
            windows.append({**row, "dimension": c.dimension})
    changed = 0
    for query, rows in (("import_spend_accounts", accounts),
                        ("import_spend_counters", windows)):
        if rows:
            changed += len(await fetch_all(conn, sql.queries[query], {"rows": Jsonb(rows)}))
    return changed


async def import_spend(conn: AsyncConnection[Any], spend: LocalSpend, *,
                       team_names: dict[str, str],
                       progress: Callable[[str], None] = lambda _: None) -> SpendReport:
    """Copy ``spend``'s permits and add the new ones' spend to the counters, on ``conn``
    inside the caller's transaction (see the module docstring)."""
    added: list[_Permit] = []
    done = 0
    for chunk in _chunks(spend.permits):
        rows = await fetch_all(conn, sql.queries["import_permits"],
                               {"permits": Jsonb([p.row for p in chunk])})
        new = {str(r["id"]) for r in rows}
        fresh = [p for p in chunk if p.id in new]
        present = [p.id for p in chunk if p.id not in new]
        if present:
            _compare(chunk, await fetch_all(conn, sql.queries["import_permits_present"],
                                            {"ids": present}))
        segments = [s.row(p.id) for p in fresh for s in p.segments]
        if segments:
            await conn.execute(sql.queries["import_segments"], {"segments": Jsonb(segments)})
        added += fresh
        done += len(chunk)
        progress(f"permits: {done}/{len(spend.permits)}")
    changed = await _apply(conn, _deltas(added), spend.frozen)
    return SpendReport(day=spend.day, month=spend.month, permits_added=len(added),
                       permits_unchanged=len(spend.permits) - len(added),
                       invalid_permits=sum(p.invalid for p in added),
                       counters_changed=changed,
                       teams=_team_spend(spend, added, team_names))


class CutoverReport(msgspec.Struct, frozen=True, kw_only=True):
    keys: ImportReport
    spend: SpendReport
    dry_run: bool


async def import_cutover(pool: Pool, teams: list[Team], keys: list[KeyRecord],
                         spend: LocalSpend, *, people: People | None = None,
                         dry_run: bool = False,
                         progress: Callable[[str], None] = lambda _: None) -> CutoverReport:
    """Teams, keys and the open month's spend in ONE transaction: all of it or nothing.
    ``dry_run``: everything is written, checked and counted, then rolled back."""
    names = {t.id: t.name for t in teams}
    async with connection(pool, "key store database") as conn, conn.transaction():
        copied = await copy_records(conn, teams, keys, people=people, progress=progress)
        moved = await import_spend(conn, spend, team_names=names, progress=progress)
        if dry_run:
            raise Rollback
    return CutoverReport(keys=copied, spend=moved, dry_run=dry_run)
