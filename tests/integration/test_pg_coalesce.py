"""Coalesced admissions (PostgresGovernanceStore(coalesce=N)) on a real database."""

from __future__ import annotations

import asyncio

from gateway.governance import Permit, PostgresGovernanceStore, Refusal
from gateway.governance._coalesce import Coalescer
from gateway.keys import PostgresKeyStore, TeamLimits
from tests.integration._pg_helpers import principal, request


async def test_concurrent_admissions_share_calls_and_keep_the_budget(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """40 concurrent admits through 2 slots: fewer than 40 database calls, each caller gets
    the decision for its own request, and exactly budget/amount permits are granted."""
    keys = PostgresKeyStore(pg_pool)
    p = await principal(keys, limits=TeamLimits(usd_micros_per_day=10_000))
    store = PostgresGovernanceStore(pg_pool)
    calls: list[int] = []

    async def counting_send(reqs):  # type: ignore[no-untyped-def]
        calls.append(len(reqs))
        return await store._admit_now(reqs)

    coalescer = Coalescer(counting_send, store._refund, max_in_flight=2)
    reqs = [request(p, usd=1_000, rid=f"r{i}") for i in range(40)]
    decisions = await asyncio.gather(*(coalescer.admit([r]) for r in reqs))
    assert sum(calls) == 40 and len(calls) < 40 and max(calls) > 1
    # The store's own tally says the same (what `mayu serve` logs at shutdown).
    assert (store.tally.admitted, store.tally.admission_calls) == (40, len(calls))
    granted = [d for [d] in decisions if isinstance(d, Permit)]
    assert len(granted) == 10
    assert all(isinstance(d, Refusal) and d.status == 402
               for [d] in decisions if not isinstance(d, Permit))
    for req, [d] in zip(reqs, decisions, strict=True):
        if isinstance(d, Permit):
            assert d.request is req


async def test_permit_of_a_cancelled_caller_is_refunded(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """A caller cancelled while its batch is in the database: the permit it was granted is
    settled CANCELLED in the background, so nothing stays pending or reserved."""
    keys = PostgresKeyStore(pg_pool)
    p = await principal(keys, limits=TeamLimits(usd_micros_per_day=10_000))
    store = PostgresGovernanceStore(pg_pool)
    release, sent = asyncio.Event(), asyncio.Event()

    async def held_send(reqs):  # type: ignore[no-untyped-def]
        sent.set()
        await release.wait()
        return await store._admit_now(reqs)

    coalescer = Coalescer(held_send, store._refund, max_in_flight=1)
    caller = asyncio.create_task(coalescer.admit([request(p, usd=4_000)]))
    await sent.wait()
    caller.cancel()
    release.set()
    while coalescer._tasks:
        await asyncio.gather(*list(coalescer._tasks))
    assert caller.cancelled()
    assert await store.pending_permits() == []
    window = await store.counter(f"team:{p.team.id}:usd:day:2026-11-29")
    assert (window["reserved"], window["committed"]) == (0, 0)


async def test_store_with_coalescing_admits_like_without(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """The store's coalesce option is transparent: same decisions as direct calls."""
    keys = PostgresKeyStore(pg_pool)
    p = await principal(keys, limits=TeamLimits(usd_micros_per_day=3_000))
    store = PostgresGovernanceStore(pg_pool, coalesce=1)
    decisions = await asyncio.gather(*(store.admit([request(p, usd=1_000, rid=str(i))])
                                       for i in range(5)))
    assert [isinstance(d, Permit) for [d] in decisions].count(True) == 3


async def test_cancelled_direct_admission_is_refunded(pg_pool, pg_dsn) -> None:  # type: ignore[no-untyped-def]
    """A caller cancelled while its admission waits on a row lock: once the database
    grants it, the permit is settled CANCELLED, so nothing stays pending or reserved."""
    import psycopg

    keys = PostgresKeyStore(pg_pool)
    p = await principal(keys, limits=TeamLimits(usd_micros_per_day=10_000))
    store = PostgresGovernanceStore(pg_pool)
    [first] = await store.admit([request(p, usd=1_000)])  # creates the counter rows
    window = f"team:{p.team.id}:usd:day:2026-11-29"
    async with await psycopg.AsyncConnection.connect(pg_dsn) as blocker:
        await blocker.execute("SELECT 1 FROM counters WHERE key = %s FOR UPDATE", (window,))
        caller = asyncio.create_task(store.admit([request(p, usd=2_000)]))
        deadline = asyncio.get_running_loop().time() + 30
        while True:  # until the admission is in the database, waiting on the lock
            cur = await blocker.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%%inferplane_admit_%%'")
            if (await cur.fetchone())[0]:  # type: ignore[index]
                break
            assert asyncio.get_running_loop().time() < deadline, "admission never waited"
            await asyncio.sleep(0.01)
        caller.cancel()
        await blocker.rollback()  # releases the lock: the admission now completes
    while store._background or not caller.done():
        await asyncio.sleep(0.01)
        await asyncio.gather(*list(store._background))
    assert caller.cancelled()
    assert await store.pending_permits() == [first.id]  # type: ignore[union-attr]
    row = await store.counter(window)
    assert (row["reserved"], row["committed"]) == (1_000, 0)


async def test_the_store_logs_what_its_calls_carried_at_close(pg_pool, caplog) -> None:  # type: ignore[no-untyped-def]
    """8 concurrent admissions and their 8 settlements through one call slot each: the
    tally counts every request and settlement once, in one call each, and close() logs it
    in one line (as the local store logs its transactions)."""
    import logging

    from tests.settling import exact, settlement

    keys = PostgresKeyStore(pg_pool)
    p = await principal(keys, limits=TeamLimits(usd_micros_per_day=100_000))
    store = PostgresGovernanceStore(pg_pool, coalesce=1, settle_coalesce=1)
    decisions = await asyncio.gather(*(store.admit([request(p, usd=1_000, rid=f"r{i}")])
                                       for i in range(8)))
    permits = [d for [d] in decisions if isinstance(d, Permit)]
    assert len(permits) == 8
    await asyncio.gather(*(store.settle(d.id, settlement(d.request, exact(10, 500)))
                           for d in permits))
    t = store.tally
    assert (t.admitted, t.settled, t.merged_calls) == (8, 8, 0)
    # All eight queue before the one slot's first call goes (asyncio runs the gathered
    # tasks before the drain they start): one call each.
    assert (t.admission_calls, t.settlement_calls) == (1, 1)
    with caplog.at_level(logging.INFO, logger="mayu.governance"):
        await store.close()
    assert ("shared governance store: 8 admissions in 1 calls, 8 settlements in 1 calls"
            in caplog.text)
