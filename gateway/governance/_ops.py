"""What operators read about permits and frozen counters (``mayu permits`` / ``accounts``).

Both governance stores answer these with the same shapes, so the operator CLI works the
same on the local SQLite file and the shared Postgres database. The local store's
readers live here too (their statements in ``sql/local/governance.sql``; the Postgres
store's in ``sql/queries.sql``), which keeps the request-path module small.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta

import msgspec

import sql
from gateway.governance._model import AdmissionRequest, Permit
from gateway.localdb import Statements

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class PermitInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One permit as an operator sees it."""

    id: str
    request_id: str
    key_id: str
    team_id: str
    user: str | None
    model: str
    token_bound: int
    usd_bound: int
    status: str
    """``pending``, or the outcome kind it was settled with (``uncertain``, ``invalid``…)."""
    created_at: datetime
    age_s: int
    """Seconds since admission, by the store's own clock (the database's in Postgres)."""
    tokens_committed: int | None = None
    usd_committed: int | None = None
    tokens_liability: int | None = None
    usd_liability: int | None = None
    bound_exceeded: bool = False
    detail: str | None = None
    """The settlement's detail (for an operator resolution: who and why)."""
    route: str | None = None
    """The request log's facts (``permit_facts``; None when the settlement carried none):
    the route it came in by, the deployment that answered, the client tool its
    User-Agent names, the HTTP status the client got, and the tokens per class the
    upstream reported."""
    deployment: str | None = None
    client: str | None = None
    http_status: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_5m_tokens: int | None = None
    cache_write_1h_tokens: int | None = None
    cache_write_unknown_tokens: int | None = None
    tier: str | None = None
    """The tier that served it when not the model's usual deployments (``soft``:
    ``routing.soft_tier``, a caller past a soft budget); None: the usual ones."""
    plane: str | None = None
    """The lease plane that served it (its usage record, shipped to inferplaned: the
    shared database's request log holds every plane's); None: admitted by this store."""


class LogFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which permits a request-log read returns (every field None: all of them)."""

    team_id: str | None = None
    key_id: str | None = None
    user: str | None = None
    model: str | None = None
    status: str | None = None
    client: str | None = None
    """The client tool (``claude-code``, ``codex``, ``openai-python`` …)."""
    plane: str | None = None
    """One lease plane's requests (only the shared database holds planes' records)."""
    since: datetime | None = None
    """Admitted at or after."""
    until: datetime | None = None
    """Admitted before."""
    before: tuple[datetime, str] | None = None
    """The page position: permits admitted before this (admission time, permit id)."""


class FrozenCounter(msgspec.Struct, frozen=True, kw_only=True):
    """A money window or policy account frozen after invalid usage."""

    counter: str
    kind: str
    limit: int | None
    reserved: int
    committed: int
    frozen_by: str | None
    """The permit whose invalid usage froze it, when the store knows."""
    liability: int = 0


class SummaryFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One group and period of the request log summed as ``/v1/usage`` counts it (a
    group not asked for, and the period of bucket ``none``, are None)."""

    team_id: str | None = None
    user: str | None = None
    key_id: str | None = None
    model: str | None = None
    tool: str | None = None
    period: str | None = None
    """``2026-12-04`` (day), ``2026-12-04T13`` (hour, UTC), None (bucket none)."""
    requests: int = 0
    tokens_committed: int = 0
    usd_committed: int = 0
    tokens_liability: int = 0
    usd_liability: int = 0
    tokens_reserved: int = 0
    usd_reserved: int = 0


def summary_params(f: LogFilter, groups: tuple[str, ...], bucket: str) -> dict[str, object]:
    """The grouping parameters both stores' ``request_summary`` take."""
    return {f"by_{g}": g in groups for g in ("team", "user", "key", "model", "tool")} | {
        "bucket": bucket, "team_id": f.team_id, "key_id": f.key_id, "user": f.user,
        "model": f.model, "status": f.status, "client": f.client, "plane": f.plane}


def _at(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


# -- local (SQLite) ------------------------------------------------------------------------

_SQL = Statements(sql.local_governance)


def _permit_info(row: sqlite3.Row, now_us: int) -> PermitInfo:
    pending = row["status"] == "pending"
    return PermitInfo(
        id=row["id"], request_id=row["request_id"], key_id=row["key_id"],
        team_id=row["team_id"], user=row["user"], model=row["model"],
        token_bound=row["token_bound"], usd_bound=row["usd_bound"], status=row["status"],
        created_at=_at(row["created_us"]),
        age_s=max(0, now_us - row["created_us"]) // 1_000_000,
        tokens_committed=None if pending else row["tokens_committed"],
        usd_committed=None if pending else row["usd_committed"],
        tokens_liability=None if pending else row["tokens_liability"],
        usd_liability=None if pending else row["usd_liability"],
        bound_exceeded=bool(row["bound_exceeded"]),
        detail=None if pending else row["detail"],
        **{name: row[name] for name in FACTS})


FACTS = ("route", "deployment", "client", "http_status", "input_tokens", "output_tokens",
         "cache_read_tokens", "cache_write_5m_tokens", "cache_write_1h_tokens",
         "cache_write_unknown_tokens", "tier")
"""The request log's facts every permit read carries (:class:`PermitInfo`)."""


def local_permits(conn: sqlite3.Connection, now_us: int, *, pending_only: bool,
                  older_than_s: int | None, limit: int | None) -> list[PermitInfo]:
    """Permits oldest first, optionally only pending ones admitted before a cut-off."""
    params = {"pending_only": pending_only, "limit": limit,
              "created_before": None if older_than_s is None
              else now_us - older_than_s * 1_000_000}
    return [_permit_info(r, now_us) for r in _SQL["permits"].execute(conn, params)]


def _us(moment: datetime | None) -> int | None:
    return None if moment is None else (moment - _EPOCH) // timedelta(microseconds=1)


def local_request_log(conn: sqlite3.Connection, now_us: int, f: LogFilter,
                      limit: int | None) -> list[PermitInfo]:
    """Permits newest first, filtered (the request log); none of a lease plane (a local
    file holds its own permits only)."""
    if f.plane is not None:
        return []
    params = {"team_id": f.team_id, "key_id": f.key_id, "user": f.user, "model": f.model,
              "status": f.status, "client": f.client, "since_us": _us(f.since),
              "until_us": _us(f.until),
              "before_us": _us(f.before[0]) if f.before else None,
              "before_id": f.before[1] if f.before else None, "limit": limit}
    return [_permit_info(r, now_us) for r in _SQL["request_log"].execute(conn, params)]


def local_request_summary(conn: sqlite3.Connection, f: LogFilter, groups: tuple[str, ...],
                          bucket: str) -> list[SummaryFigures]:
    """The request log summed per group and UTC period (the summary)."""
    if f.plane is not None:
        return []
    params = summary_params(f, groups, bucket) | {"since_us": _us(f.since),
                                                  "until_us": _us(f.until)}
    return [SummaryFigures(**dict(r)) for r in _SQL["request_summary"].execute(conn, params)]


def local_permit_info(conn: sqlite3.Connection, permit_id: str,
                      now_us: int) -> PermitInfo | None:
    row = _SQL["permit_info"].execute(conn, {"id": permit_id}).fetchone()
    return None if row is None else _permit_info(row, now_us)


def local_get_permit(conn: sqlite3.Connection, permit_id: str) -> Permit | None:
    """The permit with the AdmissionRequest it was granted for (stored as JSON)."""
    row = _SQL["permit_request"].execute(conn, {"id": permit_id}).fetchone()
    if row is None:
        return None
    return Permit(id=permit_id, request=msgspec.json.decode(row["request"],
                                                            type=AdmissionRequest))


def local_frozen(conn: sqlite3.Connection) -> list[FrozenCounter]:
    """Every frozen counter (windows and policy accounts share ``gov_counters`` here)."""
    # The captured limit lives on the charge that froze the counter, not the counter row.
    rows = _SQL["frozen_counters"].execute(conn)
    return [FrozenCounter(counter=r["counter"], kind=r["kind"], limit=r["limit"],
                          reserved=r["reserved"], committed=r["committed"],
                          frozen_by=r["frozen_by"], liability=r["liability"]) for r in rows]
