"""Coalesced settlements (PostgresGovernanceStore(settle_coalesce=N)) on a real database."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import SettlementConflict, UnknownPermit
from gateway.governance import Permit, PostgresGovernanceStore
from gateway.keys import PostgresKeyStore, TeamLimits
from gateway.pricing import Usage
from tests.integration._pg_helpers import principal, request
from tests.settling import exact, settlement

pytestmark = pytest.mark.integration

LIMITS = TeamLimits(tpm=10_000_000, tokens_per_day=10_000_000, usd_micros_per_day=10_000_000)


async def _permits(store: PostgresGovernanceStore, keys: PostgresKeyStore, n: int,
                   team: str = "t1") -> list[Permit]:
    p = await principal(keys, team=team, limits=LIMITS)
    out = []
    for i in range(n):
        [d] = await store.admit([request(p, tokens=100, usd=1_000, rid=f"{team}-{i}")])
        assert isinstance(d, Permit)
        out.append(d)
    return out


async def test_concurrent_settlements_share_transactions_and_add_up(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """40 concurrent settlements through 1 slot: fewer than 40 transactions, each caller
    gets its own permit's result, and the windows hold exactly the sum, nothing reserved."""
    keys = PostgresKeyStore(pg_pool)
    store = PostgresGovernanceStore(pg_pool, settle_coalesce=1)
    permits = await _permits(store, keys, 40)
    batches: list[int] = []
    many = store._settle_many

    async def counting(items):  # type: ignore[no-untyped-def]
        batches.append(len(items))
        return await many(items)
    store._settle_many = counting  # type: ignore[method-assign]
    assert store._settler is not None
    store._settler._many = counting
    results = await asyncio.gather(*(store.settle(d.id, settlement(d.request, exact(
        Usage(input=30 + i, output=10).total_tokens(), 100 + i)))
        for i, d in enumerate(permits)))
    assert batches and max(batches) > 1 and sum(batches) < 40 + len(batches)
    assert [r.permit_id for r in results] == [d.id for d in permits]
    assert [r.usd_committed for r in results] == [100 + i for i in range(40)]
    team = permits[0].request.team_id
    window = await store.counter(f"team:{team}:usd:day:2026-11-29")
    assert window is not None
    assert window["committed"] == sum(100 + i for i in range(40))
    assert window["reserved"] == 0
    assert await store.pending_permits() == []


async def test_a_batch_keeps_each_settlements_own_answer(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """In one batch: a different second settlement is a conflict, an unknown permit is
    unknown, an identical replay is a replay — each for its own caller only; the rest
    settle."""
    keys = PostgresKeyStore(pg_pool)
    store = PostgresGovernanceStore(pg_pool, settle_coalesce=1)
    a, b, c = await _permits(store, keys, 3)
    first = settlement(a.request, exact(Usage(input=10, output=5).total_tokens(), 50))
    await store.settle(a.id, first)
    other = settlement(a.request, exact(Usage(input=11, output=5).total_tokens(), 51))
    items = [(a.id, other), (b.id, settlement(b.request, exact(15, 60))),
             ("00000000-0000-0000-0000-000000000000", first), (a.id, first),
             (c.id, settlement(c.request, exact(15, 70)))]
    out = await store._settle_many(items)
    assert isinstance(out[0], SettlementConflict)
    assert not isinstance(out[1], Exception) and out[1].usd_committed == 60
    assert isinstance(out[2], UnknownPermit)
    assert not isinstance(out[3], Exception) and out[3].replay
    assert not isinstance(out[4], Exception) and out[4].usd_committed == 70
    assert await store.pending_permits() == []


async def test_batches_on_crossing_teams_never_deadlock(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """Settlement batches naming permits of two teams in opposite orders, racing each
    other and admissions of both teams: every one completes (locks in one global order)."""
    keys = PostgresKeyStore(pg_pool)
    store = PostgresGovernanceStore(pg_pool, coalesce=2)
    xs = await _permits(store, keys, 20, team="tx")
    ys = await _permits(store, keys, 20, team="ty")
    px = await principal(keys, team="tx")
    py = await principal(keys, team="ty")

    def batch(pairs: list[tuple[Permit, Permit]], flip: bool):  # type: ignore[no-untyped-def]
        items = []
        for x, y in pairs:
            first, second = (y, x) if flip else (x, y)
            items += [(first.id, settlement(first.request, exact(10, 5))),
                      (second.id, settlement(second.request, exact(10, 5)))]
        return store._settle_many(items)
    pairs = list(zip(xs, ys, strict=True))
    results = await asyncio.wait_for(asyncio.gather(
        *(batch(pairs[i:i + 2], flip=bool(i % 4)) for i in range(0, 20, 2)),
        *(store.admit([request(p, rid=f"race{i}")]) for i in range(10) for p in (px, py))),
        timeout=60)
    for r in results[:10]:
        assert all(not isinstance(x, Exception) for x in r)
    assert len(await store.pending_permits()) == 20  # the racing admissions, unsettled
