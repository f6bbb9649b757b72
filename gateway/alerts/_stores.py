"""Where alert events are deduplicated: the shared database, or the local SQLite file.

Both answer one question per batch of budgets a settlement moved — which thresholds are
reached now, and which of them this replica is the first to see — and record what
became of a delivery. The shared store does it in ONE statement
(``sql/alert_queries.sql`` ``budget_alerts``: read the counters, ``INSERT … ON CONFLICT
DO NOTHING RETURNING`` into ``alert_events``), so across replicas exactly one claims
each (counter, window, threshold). The local store runs the same steps in one
``BEGIN IMMEDIATE`` transaction on the governance store's own file
(``sql/local/alerts.sql``), so a restart never delivers an event twice.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

import msgspec

import sql
from gateway.alerts._model import AlertEvent, Budget, CheckResult, thresholds_reached
from gateway.localdb import SqliteBase, Statements

_SQL = Statements(sql.local_alerts)

if TYPE_CHECKING:  # the Postgres driver is imported only by the shared profile
    from gateway.db import Pool

class AlertStore(Protocol):
    async def open(self) -> None: ...

    async def check(self, budgets: list[Budget], *, replica: str) -> CheckResult:
        """Thresholds the budgets reached; the events this call claimed first."""

    async def delivered(self, event: AlertEvent, *, ok: bool, attempts: int,
                        error: str | None) -> None:
        """Record one event's delivery outcome (``delivered_at`` only when ``ok``)."""

    async def fired(self, *, since: datetime, limit: int) -> list[AlertEvent]:
        """The events first seen at or after ``since``, newest first."""

    async def close(self) -> None: ...


class PostgresAlertStore:
    """:class:`AlertStore` on the shared database (``alert_events``)."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def open(self) -> None:
        """The pool belongs to the app lifespan (already open)."""
        return None

    async def check(self, budgets: list[Budget], *, replica: str) -> CheckResult:
        from gateway.db import connection, fetch_one

        params = {"budgets": msgspec.json.encode(budgets).decode(), "replica": replica}
        async with connection(self._pool, "alert store") as conn:
            row = await fetch_one(conn, sql.alert_queries["budget_alerts"], params)
        assert row is not None
        return CheckResult(claimed=msgspec.convert(row["claimed"], list[AlertEvent]),
                           crossed=[(str(c), int(t)) for c, t in row["crossed"]])

    async def delivered(self, event: AlertEvent, *, ok: bool, attempts: int,
                        error: str | None) -> None:
        from gateway.db import connection

        params = {"ok": ok, "attempts": attempts, "error": error, "counter": event.counter,
                  "window": event.window, "threshold": event.threshold}
        async with connection(self._pool, "alert store") as conn:
            await conn.execute(sql.alert_queries["alert_delivered"], params)

    async def fired(self, *, since: datetime, limit: int) -> list[AlertEvent]:
        from gateway.db import connection, fetch_all

        async with connection(self._pool, "alert store") as conn:
            rows = await fetch_all(conn, sql.alert_queries["fired_alerts"],
                                   {"since": since, "limit": limit})
        return [AlertEvent(**r) for r in rows]

    async def close(self) -> None:
        """The pool belongs to the app lifespan."""
        return None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class SqliteAlertStore(SqliteBase):
    """:class:`AlertStore` in the local profile's SQLite file (``alert_events`` beside
    the governance store's ``gov_counters``), on its own connection: the same
    transactions as every local store (:class:`gateway.localdb.SqliteBase`), a read one a
    WAL snapshot that never blocks admissions."""

    schema = sql.local_alerts["schema"]

    async def check(self, budgets: list[Budget], *, replica: str) -> CheckResult:
        """Read first (no lock an admission would wait for); take the write lock only to
        insert thresholds reached and not yet claimed — rare, at most three per window."""
        def read(conn: sqlite3.Connection) -> tuple[list[AlertEvent], list[tuple[str, int]]]:
            new: list[AlertEvent] = []
            crossed: list[tuple[str, int]] = []
            for b in budgets:
                row = _SQL["figures"].execute(conn, {"counter": b.counter}).fetchone()
                if row is None:
                    continue
                reached = thresholds_reached(row["committed"], row["liability"], b.limit)
                if not reached:
                    continue
                crossed += [(b.counter, t) for t in reached]
                done = {r["threshold"] for r in _SQL["claimed"].execute(
                    conn, {"counter": b.counter, "window": b.window})}
                new += [AlertEvent(counter=b.counter, window=b.window, threshold=t,
                                   limit=b.limit, committed=row["committed"],
                                   liability=row["liability"], reserved=row["reserved"],
                                   replica=replica, first_seen_at=_now())
                        for t in reached if t not in done]
            return new, crossed

        def claim(conn: sqlite3.Connection) -> list[AlertEvent]:
            return [e for e in new
                    if _SQL["claim"].execute(conn, msgspec.structs.asdict(e)).fetchone()]

        new, crossed = await self._run(read, write=False)
        claimed = await self._run(claim) if new else []
        return CheckResult(claimed=claimed, crossed=crossed)

    async def delivered(self, event: AlertEvent, *, ok: bool, attempts: int,
                        error: str | None) -> None:
        params = {"ok": ok, "at": _now(), "attempts": attempts, "error": error,
                  "counter": event.counter, "window": event.window,
                  "threshold": event.threshold}
        await self._run(lambda conn: _SQL["delivered"].execute(conn, params))

    async def fired(self, *, since: datetime, limit: int) -> list[AlertEvent]:
        params = {"since": since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                  "limit": limit}
        rows = await self._run(lambda conn: _SQL["fired"].execute(conn, params).fetchall(),
                               write=False)
        return [AlertEvent(**dict(r)) for r in rows]
