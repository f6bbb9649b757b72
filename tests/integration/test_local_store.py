"""The local governance store (SQLite): admission all-or-none, settlement, restart safety.

These run against a real SQLite file in a temp dir (the local profile's only storage);
the clock is injected so bucket refill and calendar windows are deterministic.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime

import pytest

from gateway.errors import SettlementConflict, UnknownPermit
from gateway.governance import (
    BUCKET_SCALE,
    LocalGovernanceStore,
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
    Settlement,
)
from gateway.keys import KeyLimits, TeamLimits
from gateway.pricing import Usage
from tests.integration._local import admit_one, opened, principal, request
from tests.settling import exact, settlement


def complete(tokens: int, cost: int) -> Outcome:
    return exact(tokens, cost)


@pytest.fixture
async def store(tmp_path, clock):
    async with opened(LocalGovernanceStore(str(tmp_path / "gov.db"), clock=clock)) as s:
        yield s


async def settle(store, permit: Permit, outcome: Outcome):
    return await store.settle(permit.id, settlement(permit.request, outcome))


DAY_USD = "team:team_1:usd:day:2026-11-29"
DAY_TOKENS = "team:team_1:tokens:day:2026-11-29"
TPM = "team:team_1:tpm"
RPM = "team:team_1:rpm"


async def test_concurrent_admissions_never_overshoot_the_day_limit(store):
    """200 concurrent admissions on one team admit exactly limit // bound, refuse with 402,
    and settling them all commits exactly the actual costs with nothing left reserved."""
    limit, bound = 1_000_000, 30_000
    p = principal(TeamLimits(usd_micros_per_day=limit))
    results = await asyncio.gather(*(admit_one(store, request(p, usd=bound))
                                      for _ in range(200)))
    permits = [r for r in results if isinstance(r, Permit)]
    refusals = [r for r in results if isinstance(r, Refusal)]
    assert len(permits) == limit // bound
    assert len(permits) * bound <= limit
    assert {r.status for r in refusals} == {402}
    assert all(r.counter == DAY_USD for r in refusals)
    state = await store.counter(DAY_USD)
    assert state.reserved == len(permits) * bound and state.committed == 0

    rng = random.Random(7)
    costs = [rng.randint(0, bound) for _ in permits]
    await asyncio.gather(*(settle(store, pm, complete(10, c))
                           for pm, c in zip(permits, costs, strict=True)))
    state = await store.counter(DAY_USD)
    assert state.committed == sum(costs)
    assert state.reserved == 0


async def test_interleaved_admit_and_settle_hold_the_limit_at_every_point(store):
    """With admissions and settlements interleaving, committed + reserved never exceeds
    the limit as observed after every step."""
    limit, bound = 500_000, 40_000
    p = principal(TeamLimits(usd_micros_per_day=limit))
    observed: list[int] = []
    rng = random.Random(11)

    async def one(cost: int) -> None:
        result = await admit_one(store, request(p, usd=bound))
        s = await store.counter(DAY_USD)
        observed.append(s.committed + s.reserved)
        if isinstance(result, Permit):
            await settle(store, result, complete(5, cost))
            s = await store.counter(DAY_USD)
            observed.append(s.committed + s.reserved)
        else:
            assert result.status == 402

    await asyncio.gather(*(one(rng.randint(0, bound)) for _ in range(200)))
    assert max(observed) <= limit
    assert (await store.counter(DAY_USD)).reserved == 0


async def test_tpm_true_up_credits_back_unused_tokens(store):
    """A complete outcome below the bound credits the TPM bucket back the difference."""
    p = principal(TeamLimits(tpm=1000))
    permit = await admit_one(store, request(p, tokens=600))
    assert (await store.counter(TPM)).balance == 400 * BUCKET_SCALE
    await settle(store, permit, complete(100, 0))
    assert (await store.counter(TPM)).balance == 900 * BUCKET_SCALE


async def test_tpm_true_up_never_credits_above_capacity(store, clock):
    """A credit after the bucket has refilled stops at capacity."""
    p = principal(TeamLimits(tpm=1000))
    permit = await admit_one(store, request(p, tokens=600))
    clock.advance(seconds=60)
    await settle(store, permit, complete(100, 0))
    assert (await store.counter(TPM)).balance == 1000 * BUCKET_SCALE


async def test_tpm_true_up_debits_into_debt_and_refill_repays_it(store, clock):
    """An under-estimate debits the excess into debt; admissions wait for refill."""
    p = principal(TeamLimits(tpm=1000))
    permit = await admit_one(store, request(p, tokens=100))
    await settle(store, permit, complete(1500, 0))
    assert (await store.counter(TPM)).balance == -500 * BUCKET_SCALE
    refused = await admit_one(store, request(p, tokens=10))
    assert isinstance(refused, Refusal) and refused.status == 429
    assert refused.counter == TPM and refused.retry_after == 31
    clock.advance(seconds=31)  # refills 516 tokens: debt repaid, 16 available
    assert isinstance(await admit_one(store, request(p, tokens=10)), Permit)


async def test_cancelled_refunds_every_counter_fully(store):
    """Cancelled before dispatch: buckets and windows return to their state before."""
    p = principal(TeamLimits(rpm=10, tpm=1000, tokens_per_day=5000, usd_micros_per_day=10**6))
    permit = await admit_one(store, request(p, tokens=700, usd=50_000))
    result = await settle(store, permit, Outcome(kind=OutcomeKind.CANCELLED))
    assert (result.tokens_committed, result.usd_committed) == (0, 0)
    assert (await store.counter(RPM)).balance == 10 * BUCKET_SCALE
    assert (await store.counter(TPM)).balance == 1000 * BUCKET_SCALE
    for name in (DAY_USD, DAY_TOKENS):
        s = await store.counter(name)
        assert (s.reserved, s.committed) == (0, 0)


async def test_uncertain_outcome_turns_the_bounds_into_liability(store):
    """Missing usage commits nothing unobserved: the bounds become liability, which keeps
    binding the window like a reservation (TPM is trued up to the worst case)."""
    p = principal(TeamLimits(tpm=1000, tokens_per_day=5000, usd_micros_per_day=100_000))
    permit = await admit_one(store, request(p, tokens=700, usd=50_000))
    result = await settle(store, permit, Outcome(kind=OutcomeKind.UNCERTAIN))
    assert (result.tokens_committed, result.usd_committed) == (0, 0)
    assert (result.tokens_liability, result.usd_liability) == (700, 50_000)
    usd = await store.counter(DAY_USD)
    assert (usd.committed, usd.liability, usd.reserved) == (0, 50_000, 0)
    assert (await store.counter(DAY_TOKENS)).liability == 700
    assert (await store.counter(TPM)).balance == 300 * BUCKET_SCALE
    refused = await admit_one(store, request(p, tokens=10, usd=50_001))
    assert isinstance(refused, Refusal) and refused.status == 402
    assert "liability 50000" in refused.reason


async def test_tokens_known_settles_tokens_exactly_and_the_dearer_class_as_liability(store):
    """Price uncertain: tokens commit exactly, money at the cheaper write class, the
    difference to the dearer one is liability."""
    p = principal(TeamLimits(tokens_per_day=5000, usd_micros_per_day=10**6))
    permit = await admit_one(store, request(p, tokens=700, usd=50_000))
    outcome = Outcome(kind=OutcomeKind.TOKENS_KNOWN, usage=Usage(input=20,
                                                                  cache_write_unknown=30))
    result = await settle(store, permit, outcome)
    assert result.kind is OutcomeKind.TOKENS_KNOWN
    assert (await store.counter(DAY_TOKENS)).committed == 50
    usd = await store.counter(DAY_USD)
    # TEST_PRICE: input 1 µUSD/token, 5m write 1.25, 1h write 2.
    assert (usd.committed, usd.liability) == (20 + 38, 60 - 38)


async def test_invalid_changes_no_counter_and_freezes_money_accounts(store):
    """Invalid usage moves no counter, freezes the money windows, and later admissions
    charging them are refused 402 naming the freeze."""
    p = principal(TeamLimits(tpm=1000, tokens_per_day=5000, usd_micros_per_day=10**6),
                  KeyLimits(usd_micros_per_month=10**7))
    permit = await admit_one(store, request(p, tokens=700, usd=50_000))
    names = [c.counter for c in permit.request.charges]
    before = {n: await store.counter(n) for n in names}
    result = await store.settle(permit.id, settlement(
        permit.request, Outcome(kind=OutcomeKind.INVALID, detail="neg")))
    assert (result.tokens_committed, result.usd_committed) == (0, 0)
    after = {n: await store.counter(n) for n in names}
    for n in names:
        assert (after[n].balance, after[n].reserved, after[n].committed) == (
            before[n].balance, before[n].reserved, before[n].committed)
    frozen = {n for n in names if after[n].frozen_by == permit.id}
    assert frozen == {DAY_USD, "key:key_1:usd:month:2026-11"}
    refused = await admit_one(store, request(p, tokens=10, usd=10))
    assert isinstance(refused, Refusal) and refused.status == 402
    assert "frozen" in refused.reason
    assert await store.unfreeze(DAY_USD) and await store.unfreeze("key:key_1:usd:month:2026-11")
    assert isinstance(await admit_one(store, request(p, tokens=10, usd=10)), Permit)


async def test_replay_is_idempotent_and_a_conflicting_outcome_is_refused(store):
    """The same settlement twice answers the first result once more (replay=True) with
    no second debit; a different outcome raises SettlementConflict and changes nothing."""
    p = principal(TeamLimits(usd_micros_per_day=10**6))
    permit = await admit_one(store, request(p, usd=50_000))
    first = await settle(store, permit, complete(10, 1234))
    again = await settle(store, permit, complete(10, 1234))
    assert again.replay and not first.replay
    assert (again.tokens_committed, again.usd_committed) == (10, 1234)
    assert (await store.counter(DAY_USD)).committed == 1234
    with pytest.raises(SettlementConflict):
        await settle(store, permit, complete(10, 999))
    with pytest.raises(SettlementConflict):
        await settle(store, permit, Outcome(kind=OutcomeKind.CANCELLED))
    state = await store.counter(DAY_USD)
    assert (state.committed, state.reserved) == (1234, 0)


async def test_a_permit_settled_by_another_store_on_the_file_is_not_settled_twice(
        tmp_path, clock):
    """A store settles the permits it granted without reading them back, but claims each
    row only while it is pending: when another store on the same file (another worker, an
    operator's resolve) settled the permit first, the same outcome is a replay and another
    one a conflict, and the window is committed once."""
    path = str(tmp_path / "gov.db")
    p = principal(TeamLimits(usd_micros_per_day=10**6))
    first, other = (LocalGovernanceStore(path, clock=clock),
                    LocalGovernanceStore(path, clock=clock))
    await first.open()
    await other.open()
    try:
        a = await admit_one(first, request(p, usd=50_000))
        b = await admit_one(first, request(p, usd=50_000))
        assert not (await settle(other, a, complete(10, 1234))).replay
        assert (await settle(first, a, complete(10, 1234))).replay
        await settle(other, b, complete(10, 777))
        with pytest.raises(SettlementConflict):
            await settle(first, b, complete(10, 999))
        state = await first.counter(DAY_USD)
        assert (state.committed, state.reserved) == (1234 + 777, 0)
        c = await admit_one(first, request(p, usd=50_000))  # the usual path: its own
        assert not (await settle(first, c, complete(10, 5))).replay
        assert (await settle(first, c, complete(10, 5))).replay
        assert (await first.counter(DAY_USD)).committed == 1234 + 777 + 5
    finally:
        await other.close()
        await first.close()


async def test_unknown_permit_is_a_clear_error(store):
    """Settling a permit this store never admitted raises UnknownPermit."""
    with pytest.raises(UnknownPermit, match="never admitted"):
        await store.settle("nope", Settlement(kind=OutcomeKind.CANCELLED))


async def test_commits_must_match_the_charged_counters(store):
    """A commits map missing a charged counter is refused before any counter moves."""
    p = principal(TeamLimits(usd_micros_per_day=10**6))
    permit = await admit_one(store, request(p, usd=50_000))
    with pytest.raises(ValueError, match="missing"):
        await store.settle(permit.id, Settlement(kind=OutcomeKind.COMPLETE,
                                                 tokens_committed=1, usd_committed=1))
    assert (await store.counter(DAY_USD)).reserved == 50_000
    assert await store.pending_permits() == [permit.id]


async def test_pending_permits_survive_reopen_and_keep_binding(tmp_path, clock):
    """After close/reopen a pending permit is still pending, its reservation still refuses
    what would overshoot, and it can still be settled."""
    path = str(tmp_path / "gov.db")
    p = principal(TeamLimits(usd_micros_per_day=100_000))
    first = LocalGovernanceStore(path, clock=clock)
    await first.open()
    permit = await admit_one(first, request(p, usd=60_000))
    await first.close()

    second = LocalGovernanceStore(path, clock=clock)
    await second.open()
    try:
        assert await second.pending_permits() == [permit.id]
        refused = await admit_one(second, request(p, usd=60_000))
        assert isinstance(refused, Refusal) and refused.status == 402
        await settle(second, permit, complete(10, 25_000))
        assert isinstance(await admit_one(second, request(p, usd=60_000)), Permit)
        assert (await second.counter(DAY_USD)).committed == 25_000
    finally:
        await second.close()

    third = LocalGovernanceStore(path, clock=clock)
    await third.open()
    try:
        state = await third.counter(DAY_USD)
        assert (state.committed, state.reserved) == (25_000, 60_000)
    finally:
        await third.close()


async def test_key_store_and_governance_share_one_file(tmp_path, clock):
    """The gateway opens both local stores on one file: concurrent key resolution and
    admissions/settlements interleave without lock errors or lost counts."""
    from gateway.keys import SqliteKeyStore, hash_key

    path = str(tmp_path / "mayu.db")
    keys, gov = SqliteKeyStore(path), LocalGovernanceStore(path, clock=clock)
    await keys.open()
    await gov.open()
    try:
        await keys.create_team(name="one", limits=TeamLimits(usd_micros_per_day=10**9))
        plaintext, _ = await keys.create_key(team="one")

        async def call(i: int) -> None:
            found = await keys.resolve(hash_key(plaintext))
            assert found is not None
            permit = await admit_one(gov, request(found, usd=1000))
            assert isinstance(permit, Permit), permit
            await settle(gov, permit, complete(1, 10))
            if i % 10 == 0:
                await keys.create_key(team="one")

        await asyncio.gather(*(call(i) for i in range(100)))
        team = await keys.get_team("one")
        state = await gov.counter(f"team:{team.id}:usd:day:2026-11-29")
        assert (state.committed, state.reserved) == (1000, 0)
        assert len(await keys.list_keys()) == 11
    finally:
        await keys.close()
        await gov.close()


async def test_settlement_after_midnight_lands_in_the_captured_day(store, clock):
    """A permit admitted on day D settles into D's window even when settled on D+1."""
    clock.now = datetime(2026, 11, 29, 23, 59, 59, tzinfo=UTC)
    p = principal(TeamLimits(usd_micros_per_day=10**6))
    permit = await admit_one(store, request(p, usd=50_000, now=clock.now))
    clock.advance(seconds=2)
    await settle(store, permit, complete(10, 777))
    assert (await store.counter(DAY_USD)).committed == 777
    assert await store.counter("team:team_1:usd:day:2026-11-30") is None
    rows = await store.usage(day="2026-11-29", month="2026-11")
    team_day = [r for r in rows if r.scope == "team" and r.window == "day"]
    assert [(r.usd_committed, r.requests) for r in team_day] == [(777, 1)]
    assert not [r for r in await store.usage(day="2026-11-30", month="2026-12")]


async def test_all_or_none_refusal_changes_nothing(store):
    """When one charge fails, none of the request's other counters is reserved."""
    p = principal(TeamLimits(tokens_per_day=100), KeyLimits(usd_micros_per_day=10**6))
    refused = await admit_one(store, request(p, tokens=500, usd=10))
    assert isinstance(refused, Refusal) and refused.status == 429
    assert refused.counter == DAY_TOKENS and DAY_TOKENS in refused.reason
    assert await store.counter("key:key_1:usd:day:2026-11-29") is None
    assert await store.pending_permits() == []


async def test_rpm_refusal_is_429_with_retry_after(store, clock):
    """An exhausted RPM bucket refuses 429 with the seconds until one request refills."""
    p = principal(TeamLimits(rpm=2))
    assert isinstance(await admit_one(store, request(p)), Permit)
    assert isinstance(await admit_one(store, request(p)), Permit)
    refused = await admit_one(store, request(p))
    assert isinstance(refused, Refusal) and (refused.status, refused.retry_after) == (429, 30)
    clock.advance(seconds=30)
    assert isinstance(await admit_one(store, request(p)), Permit)


async def test_one_batch_decides_each_request_on_its_own(store):
    """admit() of a batch is all-or-none per request, in order, seeing earlier grants."""
    p = principal(TeamLimits(usd_micros_per_day=100_000))
    a, b, c = await store.admit([request(p, usd=60_000), request(p, usd=60_000),
                                 request(p, usd=40_000)])
    assert isinstance(a, Permit) and isinstance(b, Refusal) and isinstance(c, Permit)
    assert (await store.counter(DAY_USD)).reserved == 100_000


async def test_usage_counts_pending_as_reserved_and_settled_as_committed(store):
    """Usage rows per key, team and user split reserved (pending) from committed."""
    p = principal(TeamLimits(usd_micros_per_day=10**6))
    settled = await admit_one(store, request(p, tokens=300, usd=5_000))
    await admit_one(store, request(p, tokens=200, usd=4_000))
    cancelled = await admit_one(store, request(p, tokens=100, usd=1_000))
    await settle(store, settled, complete(120, 2_500))
    await settle(store, cancelled, Outcome(kind=OutcomeKind.CANCELLED))
    rows = await store.usage(day="2026-11-29", month="2026-11", key_id="key_1")
    assert {(r.scope, r.window) for r in rows} == {
        (s, w) for s in ("key", "team", "user") for w in ("day", "month")}
    for r in rows:
        assert (r.tokens_committed, r.tokens_reserved, r.usd_committed, r.usd_reserved,
                r.requests) == (120, 200, 2_500, 4_000, 2)
    assert await store.usage(day="2026-11-29", month="2026-11", key_id="other") == []


async def test_oversized_amounts_are_refused_before_any_counter_moves(store):
    """A charge too large to store exactly is a caller error (BadRequest), not a grant."""
    from gateway.errors import BadRequest
    p = principal(TeamLimits(usd_micros_per_day=10**6))
    with pytest.raises(BadRequest, match="amount"):
        await store.admit([request(p, usd=1 << 60)])
    assert await store.counter(DAY_USD) is None


async def test_admission_whose_caller_is_cancelled_is_refunded(store):
    """If the caller is cancelled while its admission transaction runs, the permit it
    committed is settled as cancelled, so it never binds the limits."""
    p = principal(TeamLimits(usd_micros_per_day=100_000))
    store._lock.acquire()  # hold the store so the admission is mid-flight when cancelled
    try:
        task = asyncio.ensure_future(admit_one(store, request(p, usd=60_000)))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        store._lock.release()
    await store.drain()
    assert await store.pending_permits() == []
    state = await store.counter(DAY_USD)
    assert (state.reserved, state.committed) == (0, 0)
    assert isinstance(await admit_one(store, request(p, usd=60_000)), Permit)


async def test_admission_rechecks_key_and_team_revisions_on_a_shared_file(tmp_path, clock):
    """With the key store in the same file, a key revoked or a team edited between
    authentication and admission is refused 503 (retryable), and nothing is reserved."""
    from gateway.keys import SqliteKeyStore, hash_key

    path = str(tmp_path / "mayu.db")
    keys, gov = SqliteKeyStore(path, clock=clock), LocalGovernanceStore(path, clock=clock)
    await keys.open()
    await gov.open()
    try:
        team = await keys.create_team(name="one", limits=TeamLimits(usd_micros_per_day=10**6))
        plaintext, record = await keys.create_key(team="one")
        before = await keys.resolve(hash_key(plaintext))
        assert isinstance(await admit_one(gov, request(before)), Permit)

        await keys.update_team("one", limits=TeamLimits(usd_micros_per_day=10))
        stale = await admit_one(gov, request(before))
        assert isinstance(stale, Refusal) and (stale.status, stale.retry_after) == (503, 1)
        assert stale.counter == f"team:{team.id}" and "snapshot mismatch" in stale.reason

        fresh = await keys.resolve(hash_key(plaintext))
        await keys.revoke_key(record.id)
        revoked = await admit_one(gov, request(fresh))
        assert isinstance(revoked, Refusal) and revoked.counter == f"key:{record.id}"
        assert revoked.status == 503
        assert len(await gov.pending_permits()) == 1
    finally:
        await keys.close()
        await gov.close()
