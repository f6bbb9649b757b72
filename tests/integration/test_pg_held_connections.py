"""The connections a store's admission and settlement calls keep between calls
(:class:`gateway.db.HeldConnections`), on a real Postgres pool.

What must hold: a clean call keeps its connection and the next call takes it again (no
pool checkout); anything else gives the connection back to the pool, which replaces a
broken one, so a database restart costs one failed call, as with the pool alone; a kept
connection goes back after ``max_age_s``; ``close`` gives every kept one back, and the
store's ``close`` does it for the store's calls.
"""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest

from gateway.db import HeldConnections, Pool
from gateway.errors import GovernanceUnavailable
from gateway.governance import Permit, PostgresGovernanceStore, build_request
from gateway.keys import PostgresKeyStore, TeamLimits, hash_key
from gateway.policy import EMPTY_SNAPSHOT
from gateway.pricing import Usage
from tests.settling import exact, settlement

pytestmark = pytest.mark.integration


async def _pid(held: HeldConnections) -> int:
    async with held.connection() as conn:
        cur = await conn.execute("SELECT pg_backend_pid() AS pid")
        row = await cur.fetchone()
    assert row is not None
    return int(row["pid"])


def _out_of_pool(pool: Pool) -> int:
    stats = pool.get_stats()
    return int(stats["pool_size"]) - int(stats["pool_available"])


async def test_a_clean_call_keeps_its_connection_for_the_next(pg_pool: Pool) -> None:
    held = HeldConnections(pg_pool, keep=1)
    first = await _pid(held)
    assert held.kept == 1 and _out_of_pool(pg_pool) == 1
    assert [await _pid(held) for _ in range(5)] == [first] * 5
    await held.close()
    assert held.kept == 0 and _out_of_pool(pg_pool) == 0
    await _pid(held)  # closed: a call still works, through the pool, and keeps nothing
    assert held.kept == 0 and _out_of_pool(pg_pool) == 0


async def test_keeps_at_most_keep_most_recent_first(pg_pool: Pool) -> None:
    held = HeldConnections(pg_pool, keep=2)
    async with held.connection() as a, held.connection() as b, held.connection() as c:
        pids = [a.pgconn.backend_pid, b.pgconn.backend_pid, c.pgconn.backend_pid]
    assert len(set(pids)) == 3
    assert held.kept == 2 and _out_of_pool(pg_pool) == 2
    # c ended first and b second: both kept; a found two kept and went back to the pool.
    # The next call takes the one kept last (b), then c.
    assert await _pid(held) == pids[1]
    async with held.connection() as first, held.connection() as second:
        assert [first.pgconn.backend_pid, second.pgconn.backend_pid] == [pids[1], pids[2]]
    await held.close()


async def test_a_broken_kept_connection_costs_one_failed_call(pg_pool: Pool,
                                                              pg_dsn: str) -> None:
    held = HeldConnections(pg_pool, keep=1)
    victim = await _pid(held)
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (victim,))
    with pytest.raises(GovernanceUnavailable, match="database unavailable"):
        await _pid(held)
    assert held.kept == 0  # given back to the pool, which drops a broken connection
    replacement = await _pid(held)
    assert replacement != victim and held.kept == 1
    await held.close()


async def test_an_error_or_an_open_transaction_gives_it_back(pg_pool: Pool) -> None:
    held = HeldConnections(pg_pool, keep=1)
    with pytest.raises(ValueError):
        async with held.connection():
            raise ValueError("the caller's own failure")
    assert held.kept == 0 and _out_of_pool(pg_pool) == 0
    async with held.connection() as conn:
        await conn.execute("BEGIN")  # left open: the pool rolls it back, never a caller
    assert held.kept == 0
    async with held.connection() as conn:
        cur = await conn.execute("SELECT pg_current_xact_id_if_assigned() IS NULL AS idle,"
                                 " now() = statement_timestamp() AS fresh")
        row = await cur.fetchone()
    assert row == {"idle": True, "fresh": True}
    await held.close()


async def test_never_keeps_the_pools_last_connection(pg_dsn: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.config import DatabaseSettings
    from gateway.db import open_pool

    monkeypatch.setenv("INFERPLANE_DATABASE_URL", pg_dsn)
    pool = open_pool(DatabaseSettings(pool_min_size=1, pool_max_size=2, pool_timeout_s=1.0))
    await pool.open(wait=True)
    try:
        held = HeldConnections(pool, keep=2)
        async with held.connection(), held.connection():
            pass
        assert held.kept == 1  # the second went back: the pool keeps one for others
        async with pool.connection() as conn:  # a key lookup, a usage read: no wait
            await conn.execute("SELECT 1")
        await held.close()
    finally:
        await pool.close()


async def test_a_kept_connection_goes_back_after_max_age(pg_pool: Pool) -> None:
    held = HeldConnections(pg_pool, keep=1, max_age_s=0.0)
    await _pid(held)
    assert held.kept == 0 and _out_of_pool(pg_pool) == 0


async def test_the_store_admits_and_settles_on_kept_connections(pg_pool: Pool) -> None:
    keys = PostgresKeyStore(pg_pool)
    await keys.create_team(name="held", limits=TeamLimits(usd_micros_per_day=10**9))
    plaintext, _ = await keys.create_key(team="held")
    principal = await keys.resolve(hash_key(plaintext))
    assert principal is not None
    store = PostgresGovernanceStore(pg_pool, coalesce=1, settle_coalesce=1)
    for i in range(4):
        req = build_request(principal, EMPTY_SNAPSHOT, request_id=f"h{i}", model="m",
                            token_bound=500, usd_bound=2_000, now=datetime.now(UTC))
        [permit] = await store.admit([req])
        assert isinstance(permit, Permit)
        result = await store.settle(permit.id, settlement(req, exact(
            Usage(input=300, output=100).total_tokens(), 1_234)))
        assert result.usd_committed == 1_234
    # One after the other, the admission and the settlement took the same kept connection.
    assert _out_of_pool(pg_pool) == 1
    rows = await store.usage(day=req.day, month=req.month, team_id=principal.team_id)
    [team_day] = [r for r in rows if r.scope == "team" and r.window == "day"]
    assert (team_day.usd_committed, team_day.usd_reserved, team_day.requests) == (4 * 1_234, 0, 4)
    await store.close()
    assert _out_of_pool(pg_pool) == 0
