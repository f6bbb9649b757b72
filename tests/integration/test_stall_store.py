"""A stalled database (its governance tables locked from another connection) on a real
Postgres: every admission and settlement of the shared store is answered within
``pool_timeout_s`` + ``statement_timeout_s``, coalescing off, on or merged.

What must hold: an admission gets GovernanceUnavailable (503, ``Retry-After``) within the
bound and nothing is charged; a settlement fails within the bound into the Governor's
journal replay, which settles it once the database answers again, leaving nothing
pending; the pool's sessions carry the statement timeout, the command-line tools' do
not; a statement cancelled by it leaves its connection kept, not broken; the refund of a
cancelled caller's permit outlasts a stall.

Each stall is released after ``STALL_CAP_S`` at the latest, so a regression fails on the
bound instead of hanging the test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
import pytest

from gateway.config import DatabaseSettings
from gateway.db import HeldConnections, Pool, fetch_one, open_pool, open_pool_now
from gateway.errors import GovernanceUnavailable
from gateway.governance import Governor, Permit, PostgresGovernanceStore
from gateway.governance._coalesce import Coalescer
from gateway.keys import PostgresKeyStore, TeamLimits
from tests.integration._pg_helpers import principal, request
from tests.settling import exact, settlement

pytestmark = pytest.mark.integration

POOL_TIMEOUT_S = 1.0
STATEMENT_TIMEOUT_S = 2.0
BOUND_S = POOL_TIMEOUT_S + STATEMENT_TIMEOUT_S + 3.0  # + room for a loaded 2-core box
STALL_CAP_S = 20.0
T = TypeVar("T")

MODES: dict[str, dict[str, Any]] = {
    "off": {"coalesce": 0, "settle_coalesce": 0},
    "coalesced": {"coalesce": 1, "settle_coalesce": 1},
    "merged": {"coalesce": 1, "settle_coalesce": 1, "merge": True},
}


@pytest.fixture
async def stall_pool(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Pool]:
    """The gateway's pool with a 1 s pool timeout and a 2 s statement timeout."""
    monkeypatch.setenv("INFERPLANE_DATABASE_URL", pg_dsn)
    pool = open_pool(DatabaseSettings(pool_min_size=1, pool_max_size=4,
                                      pool_timeout_s=POOL_TIMEOUT_S,
                                      statement_timeout_s=STATEMENT_TIMEOUT_S))
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()


@asynccontextmanager
async def stalled(dsn: str) -> AsyncIterator[None]:
    """The governance tables locked from another connection until the block ends (or
    ``STALL_CAP_S`` passed)."""
    conn = await psycopg.AsyncConnection.connect(dsn)
    await conn.execute("LOCK TABLE counters, permits IN ACCESS EXCLUSIVE MODE")
    release = asyncio.get_running_loop().call_later(
        STALL_CAP_S, lambda: asyncio.ensure_future(conn.rollback()))
    try:
        yield
    finally:
        release.cancel()
        await conn.rollback()
        await conn.close()


async def timed(call: Awaitable[T]) -> tuple[float, T | BaseException]:
    started = time.monotonic()
    try:
        outcome: T | BaseException = await call
    except Exception as exc:
        outcome = exc
    return time.monotonic() - started, outcome


@pytest.mark.parametrize("mode", MODES)
async def test_admissions_on_a_stalled_database_get_503_within_the_bound(
        stall_pool: Pool, pg_dsn: str, mode: str) -> None:
    """300 concurrent admissions on a locked database: each a retryable
    GovernanceUnavailable within pool + statement timeout, nothing charged, and the
    store admits again once the lock is gone."""
    p = await principal(PostgresKeyStore(stall_pool),
                        limits=TeamLimits(usd_micros_per_day=10**9))
    store = PostgresGovernanceStore(stall_pool, **MODES[mode])
    async with stalled(pg_dsn):
        answers = await asyncio.gather(*(timed(store.admit([request(p, rid=f"s{i}")]))
                                         for i in range(300)))
    slowest = max(elapsed for elapsed, _ in answers)
    assert slowest < BOUND_S, f"slowest admission took {slowest:.1f}s"
    for _, outcome in answers:
        assert isinstance(outcome, GovernanceUnavailable), outcome
        assert outcome.status == 503 and outcome.retry_after
    assert await store.pending_permits() == []
    assert await store.permits() == []
    [after] = await store.admit([request(p, rid="after")])
    assert isinstance(after, Permit)
    await store.close()


@pytest.mark.parametrize("mode", MODES)
async def test_settlements_on_a_stalled_database_are_replayed_once_it_answers(
        stall_pool: Pool, pg_dsn: str, mode: str) -> None:
    """20 settlements on a locked database all fail within the bound into the journal
    replay (not one by one behind the lock), which settles each once the lock is gone:
    nothing pending, the window holds exactly their sum."""
    p = await principal(PostgresKeyStore(stall_pool),
                        limits=TeamLimits(usd_micros_per_day=10**9))
    store = PostgresGovernanceStore(stall_pool, **MODES[mode])
    permits = []
    for i in range(20):
        [permit] = await store.admit([request(p, usd=1_000, rid=f"p{i}")])
        assert isinstance(permit, Permit)
        permits.append(permit)
    governor = Governor(store, replay_interval_s=0.2)
    await governor.start()
    try:
        async with stalled(pg_dsn):
            for permit in permits:
                await governor.settle(permit, settlement(permit.request, exact(10, 400)))
            elapsed, answered = await timed(governor.caught_up(timeout_s=STALL_CAP_S))
            assert answered is True and elapsed < BOUND_S, f"{elapsed:.1f}s"
            assert governor.backlog == len(permits)
        deadline = time.monotonic() + 30
        while governor.backlog and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert governor.backlog == 0
        assert await store.pending_permits() == []
        window = await store.counter(f"team:{p.team_id}:usd:day:2026-11-29")
        assert window is not None
        assert (window["committed"], window["reserved"]) == (20 * 400, 0)
    finally:
        await governor.close()
        await store.close()


async def test_pool_sessions_carry_the_statement_timeout_the_cli_pools_not(
        stall_pool: Pool, pg_dsn: str) -> None:
    """The gateway pool's sessions run with database.statement_timeout_s; a command-line
    tool's pool (open_pool_now) keeps the server's own setting."""
    async with stall_pool.connection() as conn:
        assert await fetch_one(conn, "SHOW statement_timeout") == {"statement_timeout": "2s"}
    cli = await open_pool_now(DatabaseSettings(pool_min_size=1, pool_max_size=1,
                                               statement_timeout_s=STATEMENT_TIMEOUT_S),
                              name="mayu-cli", what="test")
    try:
        async with cli.connection() as conn:
            row = await fetch_one(conn, "SHOW statement_timeout")
    finally:
        await cli.close()
    with psycopg.connect(pg_dsn) as plain:
        server = plain.execute("SHOW statement_timeout").fetchone()
    assert server is not None and server[0] != "2s"
    assert row == {"statement_timeout": server[0]}


async def test_a_statement_cancelled_by_the_timeout_keeps_its_connection(
        stall_pool: Pool) -> None:
    """A held connection whose statement hit the statement timeout is kept (it is sound)
    and serves the next call; the error is a GovernanceUnavailable naming the timeout."""
    held = HeldConnections(stall_pool, keep=1)
    with pytest.raises(GovernanceUnavailable, match="statement timeout"):
        async with held.connection() as conn:
            pid = conn.pgconn.backend_pid
            await conn.execute("SELECT pg_sleep(10)")
    assert held.kept == 1
    async with held.connection() as conn:
        assert conn.pgconn.backend_pid == pid
        await conn.execute("SELECT 1")
    await held.close()


async def test_a_cancelled_callers_refund_outlasts_a_stall(
        stall_pool: Pool, pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """A caller cancelled while its batch is granted, the database stalling right then:
    the permit's refund, refused by the statement timeout, is retried and lands once the
    lock is gone, so nothing stays pending or reserved."""
    p = await principal(PostgresKeyStore(stall_pool),
                        limits=TeamLimits(usd_micros_per_day=10**9))
    store = PostgresGovernanceStore(stall_pool, coalesce=1, settle_coalesce=1)
    sent, release = asyncio.Event(), asyncio.Event()
    lock = await psycopg.AsyncConnection.connect(pg_dsn)

    async def granted_as_it_stalls(reqs):  # type: ignore[no-untyped-def]
        sent.set()
        await release.wait()
        decisions = await store._admit_now(reqs)
        await lock.execute("LOCK TABLE counters, permits IN ACCESS EXCLUSIVE MODE")
        return decisions

    coalescer = Coalescer(granted_as_it_stalls, store._refund, max_in_flight=1)
    try:
        caller = asyncio.ensure_future(coalescer.admit([request(p, usd=4_000)]))
        await sent.wait()
        caller.cancel()
        release.set()
        deadline = time.monotonic() + STALL_CAP_S
        while "retrying" not in caplog.text:  # the first refund met the stall
            assert time.monotonic() < deadline, caplog.text
            await asyncio.sleep(0.1)
    finally:
        await lock.rollback()
        await lock.close()
    await asyncio.gather(*list(coalescer._tasks))
    assert caller.cancelled()
    assert await store.pending_permits() == []
    window = await store.counter(f"team:{p.team_id}:usd:day:2026-11-29")
    assert window is not None and (window["reserved"], window["committed"]) == (0, 0)
    await store.close()
