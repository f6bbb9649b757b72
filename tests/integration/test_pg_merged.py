"""Merged batches (PostgresGovernanceStore(merge=True)): the settlements and admissions
waiting at once go as one transaction, settlements first, on a real database."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta

import pytest

from gateway.governance import Permit, PostgresGovernanceStore, Refusal, SettleResult
from gateway.keys import PostgresKeyStore, TeamLimits
from tests.integration._pg_helpers import principal, request
from tests.settling import exact, settlement

pytestmark = pytest.mark.integration


def _counting(store: PostgresGovernanceStore) -> list[tuple[int, int]]:
    """Record (settlements, admissions) of every merged call the store makes."""
    calls: list[tuple[int, int]] = []
    merged = store._settle_admit

    async def counting(items, requests):  # type: ignore[no-untyped-def]
        calls.append((len(items), len(requests)))
        return await merged(items, requests)
    assert store._coalescer is not None
    store._coalescer._merged = counting  # type: ignore[attr-defined]
    return calls


async def test_a_hot_team_loops_through_merged_batches_and_keeps_its_budget(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """24 workers loop admit → settle on one team whose day budget fits 150 worst cases
    (merged calls happen when the workers fall out of step; how many is timing): every
    answer is its caller's own, the budget is never passed, and the window ends holding
    exactly the sum of what was committed, nothing reserved."""
    keys = PostgresKeyStore(pg_pool)
    store = PostgresGovernanceStore(pg_pool, coalesce=1, settle_coalesce=1, merge=True)
    p = await principal(keys, team="hot", limits=TeamLimits(usd_micros_per_day=150_000))
    committed: list[int] = []
    refused: list[Refusal] = []

    async def worker(w: int) -> None:
        for i in range(12):
            [d] = await store.admit([request(p, usd=1_000, tokens=50, rid=f"w{w}-{i}")])
            if isinstance(d, Refusal):
                refused.append(d)
                continue
            used = 300 + (w * 12 + i) % 700
            # The upstream call between admission and settlement, of varying length, so
            # the workers fall out of step and settlements meet admissions in the queue.
            await asyncio.sleep(random.random() * 0.003)
            result = await store.settle(d.id, settlement(d.request, exact(20, used)))
            assert result.permit_id == d.id and result.usd_committed == used
            committed.append(used)
    await asyncio.wait_for(asyncio.gather(*(worker(w) for w in range(24))), timeout=120)
    window = await store.counter(f"team:{p.team_id}:usd:day:2026-11-29")
    assert window is not None
    assert window["committed"] == sum(committed) <= 150_000
    assert window["reserved"] == 0
    assert len(committed) + len(refused) == 24 * 12
    assert all(r.status == 402 for r in refused)
    assert await store.pending_permits() == []
    t = store.tally  # every admission and settlement counted once, merged ones in both
    assert (t.admitted, t.settled) == (24 * 12, len(committed))
    assert t.merged_calls <= min(t.admission_calls, t.settlement_calls)


async def test_settlements_and_admissions_queued_together_go_as_one_call(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """A settlement and two admissions queued in one loop turn go as one call, the
    settlement first: with 1,000 of 2,000 held, admissions of 1,000 and 750 both fit only
    after the settlement released 750 of its 1,000 — admissions first would refuse the
    second. Each caller gets its own answer."""
    keys = PostgresKeyStore(pg_pool)
    store = PostgresGovernanceStore(pg_pool, coalesce=1, settle_coalesce=1, merge=True)
    calls = _counting(store)
    p = await principal(keys, team="m", limits=TeamLimits(usd_micros_per_day=2_000))
    [held] = await store.admit([request(p, usd=1_000, rid="held")])
    assert isinstance(held, Permit)
    busy = asyncio.ensure_future(store.admit([request(p, usd=1_000, rid="busy")]))
    settled = asyncio.ensure_future(store.settle(held.id, settlement(held.request,
                                                                     exact(10, 250))))
    fits = asyncio.ensure_future(store.admit([request(p, usd=750, rid="fits")]))
    [b] = await busy
    result, [f] = await settled, await fits
    assert result.permit_id == held.id and result.usd_committed == 250
    assert isinstance(b, Permit) and isinstance(f, Permit), (b, f)
    assert calls == [(1, 2)]
    window = await store.counter(f"team:{p.team_id}:usd:day:2026-11-29")
    assert window is not None
    assert (window["committed"], window["reserved"]) == (250, 1_750)


@pytest.mark.parametrize("other", ["lone", "batches"])
async def test_merged_and_unmerged_replicas_crossing_new_windows_never_deadlock(  # type: ignore[no-untyped-def]
        pg_pool, other) -> None:
    """Two replicas on one database (two stores), one merging its batches and one not,
    loop on the same two teams in opposite orders, each round admitting on a new day (new
    window rows created mid-race) while settling the round before: every call completes,
    none errors, and every window ends exact. The merged replica sends each round as one
    ``settle_admit`` call (settling one day's rows while creating the next day's); the
    unmerged one sends every admission and settlement alone (``lone``: the ``admit_one`` /
    ``settle_one`` calls, their own statements), or as coalesced batches (``batches``:
    ``admit_batch``, which writes its permits before it locks, and ``settle_batch``).
    Each call takes its rows in the global lock order, whichever call it is."""
    lone = other == "lone"
    keys = PostgresKeyStore(pg_pool)
    merged = PostgresGovernanceStore(pg_pool, coalesce=1, settle_coalesce=1, merge=True)
    unmerged = (PostgresGovernanceStore(pg_pool) if lone else
                PostgresGovernanceStore(pg_pool, coalesce=1, settle_coalesce=1))
    limits = TeamLimits(tpm=10_000_000, tokens_per_day=10_000_000,
                        usd_micros_per_day=10_000_000)
    px = await principal(keys, team="tx", limits=limits)
    py = await principal(keys, team="ty", limits=limits)
    start = datetime(2026, 12, 1, 12, tzinfo=UTC)

    async def admit(store: PostgresGovernanceStore, w: int, i: int) -> list[Permit]:
        now = start + timedelta(days=i)
        pair = (px, py) if w % 2 else (py, px)
        ra, rb = (request(pair[0], rid=f"{w}-{i}a", now=now),
                  request(pair[1], rid=f"{w}-{i}b", now=now))
        if lone and store is unmerged:
            [a], [b] = await asyncio.gather(store.admit([ra]), store.admit([rb]))
        else:
            [a, b] = await store.admit([ra, rb])
        assert isinstance(a, Permit) and isinstance(b, Permit), (a, b)
        return [a, b]

    async def settle(store: PostgresGovernanceStore, p: Permit) -> SettleResult:
        return await store.settle(p.id, settlement(p.request, exact(5, 10)))

    async def loop(store: PostgresGovernanceStore, w: int) -> int:
        # Each round admits on its day while it settles the round before, queued in one
        # loop turn: the merged replica sends them as one settle_admit call.
        done, held = 0, list[Permit]()
        for i in range(8):
            admitting = asyncio.ensure_future(admit(store, w, i))
            done += len(await asyncio.gather(*(settle(store, p) for p in held)))
            held = await admitting
        return done + len(await asyncio.gather(*(settle(store, p) for p in held)))
    counts = await asyncio.wait_for(asyncio.gather(
        *(loop(merged if w % 3 else unmerged, w) for w in range(12))), timeout=120)
    assert sum(counts) == 12 * 8 * 2
    assert merged.tally.settled + unmerged.tally.settled == 12 * 8 * 2
    assert merged.tally.merged_calls > 0 and unmerged.tally.merged_calls == 0
    assert await merged.pending_permits() == []
    for day in range(8):
        d = (start + timedelta(days=day)).date().isoformat()
        for team in (px, py):
            window = await merged.counter(f"team:{team.team_id}:usd:day:{d}")
            assert window is not None
            assert (window["committed"], window["reserved"]) == (12 * 10, 0)


async def test_a_failed_merged_call_fails_its_admissions_retries_settlements(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """The merged transaction fails as a whole (here: the call raises before reaching the
    database): its admissions get the error (nothing was dispatched for them) and its
    settlement is settled again alone, so it is not lost."""
    keys = PostgresKeyStore(pg_pool)
    store = PostgresGovernanceStore(pg_pool, coalesce=1, settle_coalesce=1, merge=True)
    p = await principal(keys, team="f", limits=TeamLimits(usd_micros_per_day=100_000))
    [held] = await store.admit([request(p, usd=1_000, rid="held")])
    assert isinstance(held, Permit)

    async def broken(items, requests):  # type: ignore[no-untyped-def]
        raise OSError("connection lost")
    assert store._coalescer is not None
    store._coalescer._merged = broken  # type: ignore[attr-defined]
    first = asyncio.ensure_future(store.admit([request(p, usd=1_000, rid="first")]))
    settled = asyncio.ensure_future(store.settle(held.id, settlement(held.request,
                                                                     exact(10, 400))))
    lost = asyncio.ensure_future(store.admit([request(p, usd=1_000, rid="lost")]))
    results = await asyncio.gather(first, settled, lost, return_exceptions=True)
    assert isinstance(results[0], OSError) and isinstance(results[2], OSError)
    assert not isinstance(results[1], BaseException) and results[1].usd_committed == 400
    window = await store.counter(f"team:{p.team_id}:usd:day:2026-11-29")
    assert window is not None
    assert (window["committed"], window["reserved"]) == (400, 0)
    assert await store.pending_permits() == []
