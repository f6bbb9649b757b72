"""Where the agents' own usage reports are kept: the shared database or the local file.

Beside the request log of the profile (Postgres ``permits``, or the local profile's
SQLite file), in a table nothing on the request path reads (``client_usage_reports``):
the reports are never billed. Both stores insert an export's reports each once
(``ON CONFLICT (event_id) DO NOTHING``: a replayed export changes nothing) and sum
them by the groups the usage API asks for (``sql/agent_usage_queries.sql``,
``sql/local/agent_usage.sql``: the same statements).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal, Protocol

import msgspec

import sql
from gateway.keys import Principal
from gateway.localdb import SqliteBase, Statements
from gateway.otlp_import._decode import ClientReport

if TYPE_CHECKING:  # the Postgres driver is imported only by the shared profile
    from gateway.db import Pool

_SQL = Statements(sql.local_agent_usage)

ReportGroup = Literal["team", "user", "key", "session", "agent"]


class ReportFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which reports a summary sums (every field None: all of them)."""

    team_id: str | None = None
    key_id: str | None = None
    user: str | None = None
    session_id: str | None = None
    since: datetime | None = None
    """The agent's event time at or after."""
    until: datetime | None = None
    """The agent's event time before."""


class ReportedFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One group and UTC day of the reports (a group not asked for is None)."""

    team_id: str | None = None
    user: str | None = None
    key_id: str | None = None
    session_id: str | None = None
    agent: str | None = None
    period: str | None = None
    reports: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reported_cost_uusd: int | None = None
    """The sum of the costs the agents reported (None: none did; Codex reports none)."""
    first_at: datetime | None = None
    last_at: datetime | None = None

    @property
    def tokens(self) -> int:
        return (self.input_tokens + self.output_tokens + self.cache_read_tokens
                + self.cache_write_tokens)


class ReportStore(Protocol):
    async def open(self) -> None: ...

    async def add(self, who: Principal, reports: Sequence[ClientReport]) -> int:
        """Store each report once (by its event id) for ``who``; how many were new."""

    async def summary(self, f: ReportFilter, *, groups: tuple[ReportGroup, ...],
                      bucket: Literal["day", "none"]) -> list[ReportedFigures]:
        """The reports summed per group and UTC day of the agent's event time."""

    async def prune(self, *, before: datetime) -> int:
        """Delete the reports whose event time is before ``before``; how many."""

    async def close(self) -> None: ...


def _params(f: ReportFilter, groups: tuple[ReportGroup, ...], bucket: str) -> dict[str, object]:
    return {f"by_{g}": g in groups for g in ("team", "user", "key", "session", "agent")} | {
        "bucket": bucket, "team_id": f.team_id, "key_id": f.key_id, "user": f.user,
        "session_id": f.session_id, "since": f.since, "until": f.until}


class PostgresReportStore:
    """:class:`ReportStore` on the shared database."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def open(self) -> None:
        """The pool belongs to the app lifespan (already open)."""

    async def add(self, who: Principal, reports: Sequence[ClientReport]) -> int:
        from gateway.db import connection, fetch_all

        if not reports:
            return 0
        params = {"team_id": who.team_id, "key_id": who.key_id, "user": who.user,
                  "reports": msgspec.json.encode(reports).decode()}
        async with connection(self._pool, "agent usage reports") as conn:
            rows = await fetch_all(conn, sql.agent_usage_queries["add_reports"], params)
        return len(rows)

    async def summary(self, f: ReportFilter, *, groups: tuple[ReportGroup, ...],
                      bucket: Literal["day", "none"]) -> list[ReportedFigures]:
        from gateway.db import connection, fetch_all

        async with connection(self._pool, "agent usage reports") as conn:
            rows = await fetch_all(conn, sql.agent_usage_queries["reported_summary"],
                                   _params(f, groups, bucket), prepare=False)
        return [ReportedFigures(**r) for r in rows]

    async def prune(self, *, before: datetime) -> int:
        from gateway.db import connection

        async with connection(self._pool, "agent usage reports") as conn:
            done = await conn.execute(sql.agent_usage_queries["prune_reports"],
                                      {"before": before})
        return done.rowcount

    async def close(self) -> None:
        """The pool belongs to the app lifespan."""


def _text(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _moment(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00"))


class SqliteReportStore(SqliteBase):
    """:class:`ReportStore` in the local profile's SQLite file (beside the governance
    store's request log), on its own connection, off the request path."""

    schema = sql.local_agent_usage["schema"]

    async def add(self, who: Principal, reports: Sequence[ClientReport]) -> int:
        now = _text(datetime.now(UTC))
        rows = [msgspec.structs.asdict(r) | {
            "team_id": who.team_id, "key_id": who.key_id, "user": who.user,
            "reported_at": _text(r.reported_at), "received_at": now} for r in reports]

        def insert(conn: sqlite3.Connection) -> int:
            return sum(_SQL["add_report"].execute(conn, row).fetchone() is not None
                       for row in rows)

        return await self._run(insert) if rows else 0

    async def summary(self, f: ReportFilter, *, groups: tuple[ReportGroup, ...],
                      bucket: Literal["day", "none"]) -> list[ReportedFigures]:
        params = _params(f, groups, bucket) | {"since": _text(f.since),
                                               "until": _text(f.until)}
        rows = await self._run(
            lambda conn: _SQL["reported_summary"].execute(conn, params).fetchall(),
            write=False)
        return [ReportedFigures(**(dict(r) | {"first_at": _moment(r["first_at"]),
                                              "last_at": _moment(r["last_at"])}))
                for r in rows]

    async def prune(self, *, before: datetime) -> int:
        params = {"before": _text(before)}
        return await self._run(lambda conn: _SQL["prune_reports"].execute(conn, params).rowcount)
