"""The lease plane's usage spool: each settled request's record, shipped to inferplaned.

A plane's request log lives in its own SQLite file; inferplaned keeps the request log of
every plane in the shared database (``POST /v1alpha1/usage``, :mod:`._records`), so the
admin API and the console there cover all of them. The path of one record:

1. **Queued as it settles.** A trigger on the governance store's settlement table
   (``sql/local/usage.sql``) queues the permit's id in the settlement's own transaction:
   a crash can lose a settlement's record only by losing the settlement itself. The
   spool holds ids only; the record is read from the request log when a batch is built,
   so it is never a payload (no prompt, no answer, no header is kept there either).
2. **Shipped in batches** (at most :data:`gateway.lease.MAX_RECORDS`, oldest first) by
   one background task, with the plane's data-plane token. While inferplaned is
   unreachable the queue grows and the task retries with a capped exponential backoff;
   requests never wait for it.
3. **Deleted once acknowledged.** inferplaned answers which ids it stored, which it
   held already for this plane (a batch sent again after a lost answer stores
   nothing twice) and which it refused (a team this plane's token may not report, an id
   held by another plane); all of them leave the queue. Refused ones are counted as
   dropped and logged.

**Bound.** At most ``bound`` ids are queued (:data:`DEFAULT_BOUND`, about 60 bytes
each in the file). Past it, a settlement is not queued and is counted in
``usage_spool_state.dropped`` (``mayu_usage_spool_dropped_total`` on ``/metrics``); the
request itself is settled and answered as always, and the plane's own request log
still holds it. Also counted as dropped: a queued permit pruned by request-log
retention before it was shipped, and a record inferplaned refused.

A liability resolved after its record was shipped (``mayu permits resolve``) is not
shipped again: the plane's own log has the resolved figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

import sql
from gateway.keys import KeyStore
from gateway.lease._background import Background, Retry
from gateway.lease._records import (
    MAX_DETAIL,
    MAX_RECORDS,
    USAGE_PATH,
    UsageAck,
    UsageBatch,
    UsageRecord,
)
from gateway.localdb import SqliteBase, Statements

log = logging.getLogger("mayu.lease.usage")
_SQL = Statements(sql.local_usage)
DEFAULT_BOUND = 1_000_000
"""Queued records at most (a day of 11 requests a second, unshipped)."""


class _Generation(msgspec.Struct):
    """The one field of a permit's stored request a record carries."""

    policy_generation: int = 0


class SpoolState(msgspec.Struct, frozen=True):
    bound: int
    queued: int
    dropped: int


class ShipFailed(Exception):
    """inferplaned did not acknowledge a batch."""


class UsageSpool(SqliteBase, Background):
    """The queue of unshipped usage records in a plane's SQLite file, and its shipper."""

    schema = sql.local_usage["schema"]

    def __init__(self, path: str, *, url: str, token: str | None,
                 key_store: KeyStore | None = None, bound: int = DEFAULT_BOUND,
                 batch: int = MAX_RECORDS, timeout_s: float = 10.0,
                 interval_s: float = 1.0, max_backoff_s: float = 10.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        """``transport``: how requests reach inferplaned (default: the network)."""
        super().__init__(path)
        self._url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._keys = key_store
        self._bound = bound
        self._batch = max(1, min(batch, MAX_RECORDS))
        self._timeout = timeout_s
        self._interval = interval_s
        self._max_backoff = max_backoff_s
        self._transport = transport
        self._plane = ""
        self._teams: dict[str, str] = {}
        self._http: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.state = SpoolState(bound, 0, 0)
        """As of the last read (each pass of the shipper)."""
        self.shipped = 0
        """Records inferplaned stored or held already, since this process started."""
        self.failures = 0

    async def open(self) -> None:
        """Open the file and install the queueing trigger (the governance store opened
        it first: the trigger is on its settlement table)."""
        await super().open()
        await self._run(_install(self._bound))
        self.state = await self._run(_state, write=False)

    async def start(self) -> None:
        """Ship in the background, as the plane id the lease client keeps in the file."""
        if self._http is None:
            self._http = httpx.AsyncClient(base_url=self._url, timeout=self._timeout,
                                           headers=self._headers, transport=self._transport)
        self._start_loop("lease-usage-shipper")

    async def stop(self) -> None:
        await self._stop_loop()

    async def close(self) -> None:
        await self.stop()
        await super().close()

    def wake(self) -> None:
        """Ship now (a test, or a drain before shutdown)."""
        self._wake.set()

    # -- the shipper -----------------------------------------------------------------

    async def _loop(self) -> None:
        retry = Retry(floor=0.5, ceiling=self._max_backoff)
        while True:
            try:
                full = await self.ship_once()
                if failed := retry.succeeded():
                    log.info("usage shipping to %s works again after %d failed tries",
                             self._url, failed)
                if full:
                    continue  # more queued: the next batch at once
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                backoff = retry.failed()
                if retry.failing == 1 or retry.failing % 20 == 0:
                    log.warning("usage shipping to %s failed (%s: %s); %d records queued, "
                                "retrying in %.1fs (%d tries so far)", self._url,
                                type(exc).__name__, exc, self.state.queued, backoff,
                                retry.failing)
                await asyncio.sleep(backoff)
                continue
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)

    async def ship_once(self) -> bool:
        """One batch shipped and acknowledged; whether the batch was full (more may be
        queued). Raises when inferplaned did not acknowledge it (nothing deleted)."""
        if not self._plane:
            self._plane = await self._run(_plane_id, write=False)
            if not self._plane:
                return False  # the lease client has not opened the file yet
        # Read first: the queue's figures stay current while inferplaned is away.
        self.state = await self._run(_state, write=False)
        rows = await self._run(_read_batch(self._batch), write=False)
        records, missing = await self._records(rows)
        if missing:  # pruned before shipping, or out of bounds: counted as dropped
            await self._run(_forget(missing, dropped=True))
        if records:
            ack = await self._post(UsageBatch(plane=self._plane, records=records))
            refused = [*ack.conflicts, *ack.refused]
            if refused:
                log.error("inferplaned refused %d usage records of plane %s (a team its "
                          "token may not report, or an id another plane holds): dropped",
                          len(refused), self._plane)
            done = [*ack.stored, *ack.present]
            await self._run(_forget(done, dropped=False))
            if refused:
                await self._run(_forget(refused, dropped=True))
            self.shipped += len(done)
        self.state = await self._run(_state, write=False)
        return len(rows) >= self._batch

    async def _post(self, batch: UsageBatch) -> UsageAck:
        assert self._http is not None, "start() first"
        try:
            r = await self._http.post(USAGE_PATH, content=msgspec.json.encode(batch),
                                      headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            raise ShipFailed(f"{type(exc).__name__}: {exc}") from exc
        if r.status_code != 200:
            raise ShipFailed(f"HTTP {r.status_code}: {r.text[:300]}")
        try:
            return msgspec.json.decode(r.content, type=UsageAck)
        except msgspec.DecodeError as exc:
            raise ShipFailed(f"not a usage acknowledgement: {exc}") from exc

    async def _records(self, rows: list[sqlite3.Row]) -> tuple[list[UsageRecord], list[str]]:
        records, missing = [], []
        if any(r["team_id"] is not None and r["team_id"] not in self._teams for r in rows):
            await self._read_teams()
        for row in rows:
            if row["request_id"] is None or row["kind"] is None:
                missing.append(row["permit_id"])
                continue
            record = _record(row, self._teams.get(row["team_id"], row["team_id"]))
            try:  # the protocol's bounds, checked here: one bad record never blocks a batch
                records.append(msgspec.json.decode(msgspec.json.encode(record),
                                                   type=UsageRecord))
            except msgspec.ValidationError as exc:
                log.error("usage record %s cannot be shipped (%s): dropped",
                          row["permit_id"], exc)
                missing.append(row["permit_id"])
        return records, missing

    async def _read_teams(self) -> None:
        if self._keys is None:
            return
        try:
            self._teams = {t.id: t.name for t in await self._keys.list_teams()}
        except Exception as exc:  # a local read failing: ship the ids as they are
            log.warning("usage shipping: cannot list local teams (%s)", exc)

    # -- metrics ---------------------------------------------------------------------

    def collector(self) -> Collector:
        """The spool's figures for a Prometheus registry (read at scrape, no I/O)."""
        return _Collector(self)


class _Collector(Collector):
    def __init__(self, spool: UsageSpool) -> None:
        self._spool = spool

    def collect(self) -> Iterator[Any]:
        s = self._spool
        yield GaugeMetricFamily("mayu_usage_spool_queued", "Usage records waiting to be "
                                "shipped to inferplaned.", value=s.state.queued)
        yield GaugeMetricFamily("mayu_usage_spool_bound", "Usage records the spool holds "
                                "at most.", value=s.state.bound)
        yield CounterMetricFamily("mayu_usage_spool_dropped", "Usage records never "
                                  "shipped (spool full, pruned first, refused).",
                                  value=s.state.dropped)
        yield CounterMetricFamily("mayu_usage_shipped", "Usage records inferplaned "
                                  "acknowledged (this process).", value=s.shipped)
        yield CounterMetricFamily("mayu_usage_ship_failures", "Batches inferplaned did "
                                  "not acknowledge (this process).", value=s.failures)


def _install(bound: int) -> Any:
    def _run(conn: sqlite3.Connection) -> None:
        for name in ("trigger_settled", "trigger_queued", "trigger_acked"):
            _SQL[name].execute(conn)
        _SQL["init_state"].execute(conn, {"bound": bound})
        _SQL["set_bound"].execute(conn, {"bound": bound})
    return _run


def _state(conn: sqlite3.Connection) -> SpoolState:
    row = _SQL["state"].execute(conn).fetchone()
    return SpoolState(int(row["bound"]), int(row["queued"]), int(row["dropped"]))


def _plane_id(conn: sqlite3.Connection) -> str:
    try:
        row = _SQL["plane"].execute(conn).fetchone()
    except sqlite3.OperationalError:  # no lease_plane table yet
        return ""
    return "" if row is None else str(row["dataplane_id"])


def _read_batch(limit: int) -> Any:
    def _read(conn: sqlite3.Connection) -> list[sqlite3.Row]:
        return list(_SQL["batch"].execute(conn, {"limit": limit}).fetchall())
    return _read


def _forget(ids: list[str], *, dropped: bool) -> Any:
    def _delete(conn: sqlite3.Connection) -> None:
        _SQL["ack"].executemany(conn, ({"permit_id": i} for i in ids))
        if dropped:
            _SQL["count_dropped"].execute(conn, {"count": len(ids)})
    return _delete


def _record(row: sqlite3.Row, team: str) -> UsageRecord:
    generation = msgspec.json.decode(row["request"], type=_Generation).policy_generation
    return UsageRecord(
        id=row["permit_id"], request_id=row["request_id"], key_id=row["key_id"], team=team,
        user=row["user"], model=row["model"], status=row["kind"], generation=generation,
        day=row["day"], month=row["month"], token_bound=row["token_bound"],
        usd_bound=row["usd_bound"], created_us=row["created_us"],
        settled_us=row["settled_us"], resolved_us=row["resolved_us"],
        fingerprint=row["fingerprint"] or "", tokens_committed=row["tokens_committed"],
        usd_committed=row["usd_committed"], tokens_liability=row["tokens_liability"],
        usd_liability=row["usd_liability"], bound_exceeded=bool(row["bound_exceeded"]),
        detail=(row["detail"] or "")[:MAX_DETAIL], route=row["route"],
        deployment=row["deployment"], client=row["client"],
        http_status=row["http_status"], input=row["input"], output=row["output"],
        cache_read=row["cache_read"], cache_write_5m=row["cache_write_5m"],
        cache_write_1h=row["cache_write_1h"], cache_write_unknown=row["cache_write_unknown"])
