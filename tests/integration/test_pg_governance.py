"""PostgresGovernanceStore + PostgresKeyStore against a real, migrated Postgres."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import psycopg
import pytest

from gateway.errors import SettlementConflict, UnknownPermit
from gateway.governance import (
    Charge,
    Outcome,
    OutcomeKind,
    Permit,
    PostgresGovernanceStore,
    Refusal,
    Settlement,
)
from gateway.keys import PostgresKeyStore, TeamLimits
from gateway.policy import EMPTY_SNAPSHOT
from gateway.pricing import InvalidUsage
from tests.integration._pg_helpers import NOW, principal, request, with_charges
from tests.settling import exact, settlement

BUDGET = TeamLimits(usd_micros_per_day=10_000, tpm=1_000)


def _complete(tokens: int, cost: int) -> Outcome:
    return exact(tokens, cost)


async def test_admit_then_settle_commits_actuals(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """A complete settlement commits the actual cost and releases the rest of the bound."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, limits=BUDGET)
    req = request(p, tokens=100, usd=4_000)
    [permit] = await gov.admit([req])
    assert isinstance(permit, Permit)
    window = f"team:{p.team.id}:usd:day:2026-11-29"
    assert (await gov.counter(window))["reserved"] == 4_000
    outcome = _complete(60, 1_234)
    result = await gov.settle(permit.id, settlement(req, outcome))
    assert (result.tokens_committed, result.usd_committed, result.replay) == (60, 1_234, False)
    row = await gov.counter(window)
    assert (row["reserved"], row["committed"]) == (0, 1_234)


async def test_budget_refuses_with_402_and_tpm_with_429(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """Money exhaustion is 402, token-rate exhaustion 429, and a refusal reserves nothing."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, limits=BUDGET)
    [money] = await gov.admit([request(p, tokens=10, usd=10_001)])
    assert isinstance(money, Refusal) and money.status == 402
    # One batch: the second request sees the first one's reservation.
    first, rate = await gov.admit([request(p, tokens=900, usd=1), request(p, tokens=200, usd=1)])
    assert isinstance(first, Permit)
    assert isinstance(rate, Refusal) and rate.status == 429 and rate.retry_after >= 1
    row = await gov.counter(f"team:{p.team.id}:usd:day:2026-11-29")
    assert row["reserved"] == 1  # only the first of the batch


async def test_replay_returns_first_result_and_conflict_is_refused(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """An exact replay returns the first result (no second debit); another outcome raises."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, limits=BUDGET)
    req = request(p, usd=5_000)
    [permit] = await gov.admit([req])
    first = _complete(50, 700)
    await gov.settle(permit.id, settlement(req, first))
    again = await gov.settle(permit.id, settlement(req, first))
    assert again.replay and again.usd_committed == 700
    other = _complete(50, 800)
    with pytest.raises(SettlementConflict):
        await gov.settle(permit.id, settlement(req, other))
    assert (await gov.counter(f"team:{p.team.id}:usd:day:2026-11-29"))["committed"] == 700


async def test_unknown_permit_and_bad_commits_are_refused(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """Settling a never-admitted permit or with commits for other counters changes nothing."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, limits=BUDGET)
    req = request(p)
    [permit] = await gov.admit([req])
    out = _complete(1, 1)
    with pytest.raises(UnknownPermit):
        await gov.settle("00000000-0000-0000-0000-000000000000", settlement(req, out))
    with pytest.raises(InvalidUsage):
        await gov.settle(permit.id, Settlement(kind=OutcomeKind.COMPLETE,
                                               commits={"team:nope:usd": 1}))
    assert await gov.pending_permits() == [permit.id]


async def test_invalid_usage_commits_nothing_and_freezes(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """INVALID changes no counter, freezes the money window (next request 402) until an
    operator unfreezes it."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, limits=BUDGET)
    req = request(p, usd=1_000)
    [permit] = await gov.admit([req])
    window = f"team:{p.team.id}:usd:day:2026-11-29"
    bad = Outcome(kind=OutcomeKind.INVALID, detail="negative input tokens")
    result = await gov.settle(permit.id, settlement(req, bad))
    assert (result.kind, result.usd_committed) == (OutcomeKind.INVALID, 0)
    row = await gov.counter(window)
    assert (row["committed"], row["reserved"], row["frozen"]) == (0, 1_000, True)
    [refused] = await gov.admit([request(p, usd=1)])
    assert isinstance(refused, Refusal) and refused.status == 402
    assert refused.counter == window
    assert await gov.unfreeze(window) and not await gov.unfreeze(window)
    [after] = await gov.admit([request(p, usd=1)])
    assert isinstance(after, Permit)


async def test_cancelled_refunds_everything_including_rpm(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """A pre-dispatch cancellation gives back the request, the tokens and the money."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, limits=TeamLimits(rpm=1, usd_micros_per_day=100))
    req = request(p, usd=100)
    [permit] = await gov.admit([req])
    [refused] = await gov.admit([request(p, usd=1)])
    assert isinstance(refused, Refusal)
    cancel = Outcome(kind=OutcomeKind.CANCELLED)
    await gov.settle(permit.id, settlement(req, cancel))
    [again] = await gov.admit([request(p, usd=100)])
    assert isinstance(again, Permit)


async def test_pending_permits_keep_binding(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """A permit never settled (a crashed gateway) keeps its reservation against the budget."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, limits=BUDGET)
    [permit] = await gov.admit([request(p, usd=9_000)])
    [refused] = await gov.admit([request(p, usd=1_001)])
    assert isinstance(refused, Refusal) and refused.status == 402
    assert await gov.pending_permits() == [permit.id]
    [fits] = await gov.admit([request(p, usd=1_000)])
    assert isinstance(fits, Permit)


async def test_revoked_through_one_pool_refused_through_another(pg_pool, pg_dsn) -> None:  # type: ignore[no-untyped-def]
    """A key revoked via one pool: a stale Principal gets 503, a fresh resolve gets None."""
    from psycopg_pool import AsyncConnectionPool

    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, limits=BUDGET)
    async with AsyncConnectionPool(pg_dsn, kwargs={"autocommit": True}, min_size=1,
                                   max_size=2) as other:
        await PostgresKeyStore(other).revoke_key(p.key_id, expected_revision=p.key_revision)
    [refused] = await gov.admit([request(p)])
    assert isinstance(refused, Refusal) and refused.status == 503
    assert refused.reason.startswith(f"key:{p.key_id}")
    keys2 = PostgresKeyStore(pg_pool)
    [record] = await keys2.list_keys(include_revoked=True)
    assert record.revoked_at is not None and record.revision == p.key_revision + 1
    assert await keys2.resolve(record.key_hash) is None


async def test_team_edit_and_generation_change_refuse_with_503(pg_pool, pg_dsn) -> None:  # type: ignore[no-untyped-def]
    """A team edit or a new policy generation after capture is a retryable 503."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, limits=BUDGET)
    await keys.update_team(p.team.id, limits=TeamLimits(usd_micros_per_day=5),
                           expected_revision=p.team.revision)
    [refused] = await gov.admit([request(p)])
    assert isinstance(refused, Refusal) and refused.status == 503
    assert refused.counter == f"team:{p.team.id}" and refused.retry_after == 1
    p2 = await principal(keys, team="t2", limits=BUDGET)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE policy_state SET generation = generation + 1")
    assert await gov.current_generation() == 1
    [stale] = await gov.admit([request(p2)])
    assert isinstance(stale, Refusal) and stale.status == 503 and stale.counter == "policy"


async def test_settlement_uses_captured_windows(pg_pool, pg_dsn) -> None:  # type: ignore[no-untyped-def]
    """Settled after 'midnight' and after its rule was deleted, a permit settles the windows
    and account limits it captured at admission."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, limits=BUDGET)
    account = Charge(counter="account:r1:team=t1:day:2026-11-29", kind="account",
                     dimension="usd", amount=2_000, limit=50_000, window="2026-11-29",
                     rule_uid="r1")
    req = with_charges(request(p, usd=2_000), account)
    [permit] = await gov.admit([req])
    # Policy deleted (new generation), and a request of the next day arrives.
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE policy_state SET generation = generation + 1")
    snap = msgspec.structs.replace(EMPTY_SNAPSHOT, generation=1)
    [tomorrow] = await gov.admit([request(p, usd=10, snapshot=snap,
                                          now=NOW + timedelta(days=1))])
    assert isinstance(tomorrow, Permit)
    out = _complete(10, 1_500)
    await gov.settle(permit.id, settlement(req, out))
    day1 = await gov.counter(f"team:{p.team.id}:usd:day:2026-11-29")
    day2 = await gov.counter(f"team:{p.team.id}:usd:day:2026-11-30")
    acct = await gov.counter("account:r1:team=t1:day:2026-11-29")
    assert (day1["committed"], day1["reserved"]) == (1_500, 0)
    assert (day2["committed"], day2["reserved"]) == (0, 10)
    assert (acct["committed"], acct["reserved"], acct["window"]) == (1_500, 0, "2026-11-29")


async def test_account_competes_with_lease_grants(pg_pool, pg_dsn) -> None:  # type: ignore[no-untyped-def]
    """A policy budget account refuses when committed + reserved + leased would pass it."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys)
    account = Charge(counter="account:r9:team=t1:month:2026-11", kind="account",
                     dimension="usd", amount=600, limit=1_000, window="2026-11", rule_uid="r9")
    [first] = await gov.admit([with_charges(request(p, usd=600), account)])
    assert isinstance(first, Permit)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE authority_accounts SET reserved = 0, leased_outstanding = 500")
    [refused] = await gov.admit([with_charges(request(p, usd=600), account)])
    assert isinstance(refused, Refusal) and refused.status == 402
    small = msgspec.structs.replace(account, amount=500)
    [fits] = await gov.admit([with_charges(request(p, usd=500), small)])
    assert isinstance(fits, Permit)


async def test_usage_reports_committed_and_reserved(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """/v1/usage rows: settled permits count committed, pending ones their bounds."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, limits=BUDGET, user="ann")
    req = request(p, tokens=100, usd=1_000)
    [a, b] = await gov.admit([req, request(p, tokens=100, usd=2_000)])
    out = _complete(40, 300)
    await gov.settle(a.id, settlement(req, out))
    rows = await gov.usage(day="2026-11-29", month="2026-11", key_id=p.key_id)
    team_day = next(r for r in rows if r.scope == "team" and r.window == "day")
    assert (team_day.tokens_committed, team_day.tokens_reserved) == (40, 100)
    assert (team_day.usd_committed, team_day.usd_reserved, team_day.requests) == (300, 2_000, 2)
    assert {(r.scope, r.window) for r in rows} == {(s, w) for s in ("key", "team", "user")
                                                     for w in ("day", "month")}
