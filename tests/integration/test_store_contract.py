"""The store contract: the local (SQLite) and shared (Postgres) stores answer alike.

Every test runs against both stores (the shared one as a gateway opens it by default,
and with its coalesced, merged lane), through the same key-store/governance-store pair a
gateway of that profile opens (the local pair shares one SQLite file, as the gateway's
do). Same outcomes, same refusal codes, figures and
wording, same replay and conflict rules, same liability arithmetic (DESIGN §5).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import SettlementConflict, UnknownPermit
from gateway.governance import (
    Governor,
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
    Refused,
    Settlement,
    split_settlement,
)
from gateway.keys import TeamLimits
from gateway.pricing import Usage
from tests.integration._pg_helpers import principal, request, store_pair
from tests.settling import exact, settlement

pytestmark = pytest.mark.integration

LIMITS = TeamLimits(tpm=100_000, tokens_per_day=50_000, usd_micros_per_day=10_000)


@dataclass
class Stores:
    name: str
    keys: Any
    gov: Any

    async def figures(self, counter: str) -> tuple[int, int, int]:
        """(committed, liability, reserved) of a window counter as stored."""
        row = await self.gov.counter(counter)
        if isinstance(row, dict):
            return row["committed"], row["liability"], row["reserved"]
        return row.committed, row.liability, row.reserved


@pytest.fixture(params=["local", "postgres", "postgres-merged"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    async with store_pair(request.param, request, tmp_path) as (keys, gov):
        yield Stores(request.param, keys, gov)

async def admitted(s: Stores, *, usd: int = 4_000, tokens: int = 1_000,
                   rid: str = "r") -> Permit:
    p = await principal(s.keys, team="t1", limits=LIMITS)
    [permit] = await s.gov.admit([request(p, usd=usd, tokens=tokens, rid=rid)])
    assert isinstance(permit, Permit), permit
    return permit


def day(permit: Permit, dim: str = "usd") -> str:
    [name] = [c.counter for c in permit.request.charges
              if c.counter.startswith("team:") and f":{dim}:day:" in c.counter]
    return name


async def test_complete_commits_exactly_and_releases_the_rest(stores):
    """A complete settlement commits its figures, reserved returns to 0, no liability."""
    permit = await admitted(stores)
    result = await stores.gov.settle(permit.id, settlement(permit.request, exact(600, 1_234)))
    assert (result.kind, result.tokens_committed, result.usd_committed,
            result.usd_liability) == (OutcomeKind.COMPLETE, 600, 1_234, 0)
    assert await stores.figures(day(permit)) == (1_234, 0, 0)
    assert await stores.figures(day(permit, "tokens")) == (600, 0, 0)


async def test_uncertain_liability_binds_like_a_reservation_with_the_same_words(stores):
    """Uncertain: committed 0, the bound is liability; a request that would pass the limit
    counting it is refused 402 with the same code, figures and wording in both stores."""
    permit = await admitted(stores, usd=7_000)
    result = await stores.gov.settle(permit.id, settlement(
        permit.request, Outcome(kind=OutcomeKind.UNCERTAIN, detail="cut")))
    assert (result.usd_committed, result.usd_liability) == (0, 7_000)
    assert (result.tokens_committed, result.tokens_liability) == (0, 1_000)
    assert await stores.figures(day(permit)) == (0, 7_000, 0)
    p = await principal(stores.keys, team="t1")
    [refused] = await stores.gov.admit([request(p, usd=3_001, rid="next")])
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.code) == (402, "budget_exhausted")
    assert refused.figures is not None
    assert (refused.figures.limit, refused.figures.committed, refused.figures.liability,
            refused.figures.reserved, refused.figures.amount) == (10_000, 0, 7_000, 0, 3_001)
    assert refused.reason == (
        f"{day(permit)}: limit 10000 µUSD would be exceeded: committed 0 + liability 7000 "
        "+ reserved 0 + this request's worst case 3001")
    [fits] = await stores.gov.admit([request(p, usd=3_000, rid="fits")])
    assert isinstance(fits, Permit)


async def test_token_quota_refusal_is_429_with_figures(stores):
    """A token quota refuses 429 token_quota_exhausted, the same in both stores."""
    p = await principal(stores.keys, team="t1", limits=LIMITS)
    [refused] = await stores.gov.admit([request(p, usd=1, tokens=50_001, rid="big")])
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.code) == (429, "token_quota_exhausted")
    assert refused.figures is not None and refused.figures.dimension == "tokens"
    assert "limit 50000 tokens would be exceeded" in refused.reason


async def test_replay_is_idempotent_and_a_different_settlement_conflicts(stores):
    """The same settlement twice: the first result again (replay); another: refused."""
    permit = await admitted(stores)
    first = await stores.gov.settle(permit.id, settlement(permit.request, exact(10, 99)))
    again = await stores.gov.settle(permit.id, settlement(permit.request, exact(10, 99)))
    assert again.replay and not first.replay
    assert (again.tokens_committed, again.usd_committed) == (10, 99)
    with pytest.raises(SettlementConflict):
        await stores.gov.settle(permit.id, settlement(permit.request, exact(10, 98)))
    assert await stores.figures(day(permit)) == (99, 0, 0)


async def test_resolve_replaces_a_liability_by_the_exact_figure(stores):
    """resolve on an uncertain permit moves its part from liability to committed; on a
    complete one it is refused; on a pending one it settles."""
    permit = await admitted(stores, usd=5_000)
    await stores.gov.settle(permit.id, settlement(
        permit.request, Outcome(kind=OutcomeKind.UNCERTAIN, usage=Usage(input=300),
                                detail="cut")))
    # TEST_PRICE: 300 input tokens at $1/Mtok = 300 µUSD observed.
    assert await stores.figures(day(permit)) == (300, 4_700, 0)
    result = await stores.gov.resolve(permit.id, settlement(permit.request, exact(700, 2_100)))
    assert (result.kind, result.usd_committed, result.usd_liability) == (
        OutcomeKind.COMPLETE, 2_100, 0)
    assert await stores.figures(day(permit)) == (2_100, 0, 0)
    assert await stores.figures(day(permit, "tokens")) == (700, 0, 0)
    with pytest.raises(SettlementConflict):
        await stores.gov.resolve(permit.id, settlement(permit.request, exact(1, 1)))
    pending = await admitted(stores, usd=100, rid="p2")
    done = await stores.gov.resolve(pending.id, settlement(pending.request, exact(5, 50)))
    assert done.usd_committed == 50


async def test_bound_exceeded_commits_in_full_without_freezing(stores):
    """Valid usage above the bound commits in full and is flagged; nothing freezes."""
    permit = await admitted(stores, usd=1_000)
    big = Settlement(kind=OutcomeKind.COMPLETE, tokens_committed=2_000, usd_committed=1_100,
                     bound_exceeded=True)
    result = await stores.gov.settle(permit.id, split_settlement(permit.request, big))
    assert result.bound_exceeded and result.usd_committed == 1_100
    assert await stores.figures(day(permit)) == (1_100, 0, 0)
    p = await principal(stores.keys, team="t1")
    [next_one] = await stores.gov.admit([request(p, usd=100, rid="after")])
    assert isinstance(next_one, Permit)


async def test_invalid_usage_freezes_with_the_same_refusal(stores):
    """Invalid usage commits nothing and freezes; the next admission: 402 account_frozen."""
    permit = await admitted(stores)
    await stores.gov.settle(permit.id, settlement(
        permit.request, Outcome(kind=OutcomeKind.INVALID, detail="negative")))
    p = await principal(stores.keys, team="t1")
    [refused] = await stores.gov.admit([request(p, usd=1, rid="frozen")])
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.code) == (402, "account_frozen")
    assert "account is frozen after invalid usage" in refused.reason


async def test_unknown_permit(stores):
    """Settling what the store never admitted raises UnknownPermit in both."""
    with pytest.raises(UnknownPermit):
        await stores.gov.settle("00000000-0000-0000-0000-000000000000",
                                Settlement(kind=OutcomeKind.CANCELLED))


async def test_governor_refusal_carries_the_store_refusal(stores):
    """The Governor raises Refused with the store's refusal (no re-plan for money)."""
    p = await principal(stores.keys, team="t1", limits=LIMITS)
    governor = Governor(stores.gov)
    with pytest.raises(Refused) as refused:
        await governor.admit_plan(request(p, usd=10_001, rid="g"))
    assert refused.value.refusal.code == "budget_exhausted"


async def test_governor_answers_first_and_catches_up(stores):
    """With settle_wait_s 0 (the default) settle hands back before the store answered
    (None); caught_up waits for the store, after which the window holds exactly the
    commit and nothing reserved."""
    p = await principal(stores.keys, team="t1", limits=LIMITS)
    governor = Governor(stores.gov)
    permit = await governor.admit_plan(request(p, usd=900, rid="af"))
    window = f"team:{p.team_id}:usd:day:2026-11-29"
    assert await governor.settle(permit, settlement(permit.request, exact(10, 250))) is None
    assert await governor.caught_up(timeout_s=30)
    assert await stores.figures(window) == (250, 0, 0)
    assert await governor.caught_up(timeout_s=0)  # nothing in flight: at once


class _HeldSettlements:
    """``store`` with its settlements held until an admission is refused (a slow store
    whose answers go first), counting the refusals it hands back."""

    def __init__(self, store: Any) -> None:
        self.store, self.refusals = store, 0
        self.gate = asyncio.Event()

    async def admit(self, requests: list[Any]) -> list[Any]:
        decisions = await self.store.admit(requests)
        if any(isinstance(d, Refusal) for d in decisions):
            self.refusals += 1
            self.gate.set()
        return list(decisions)

    async def settle(self, permit_id: str, settlement: Settlement) -> Any:
        await self.gate.wait()
        return await self.store.settle(permit_id, settlement)


async def test_a_refusal_is_decided_again_once_the_teams_settlements_landed(stores):
    """A request refused while its team's previous answer is still being settled on
    this replica is decided again once that settlement landed: 900 of 1,000 µUSD held
    by an answer that cost 100, the next request of 800 is refused once, then admitted."""
    p = await principal(stores.keys, team="t1",
                        limits=TeamLimits(usd_micros_per_day=1_000))
    held = _HeldSettlements(stores.gov)
    governor = Governor(held)
    first = await governor.admit_plan(request(p, usd=900, rid="a"))
    assert await governor.settle(first, settlement(first.request, exact(10, 100))) is None
    second = await governor.admit_plan(request(p, usd=800, rid="b"))
    assert held.refusals == 1
    assert await governor.caught_up(timeout_s=30)
    window = f"team:{p.team_id}:usd:day:2026-11-29"
    assert await stores.figures(window) == (100, 0, 800)
    await governor.settle(second, settlement(second.request, exact(10, 800)))
    assert await governor.caught_up(timeout_s=30)
    assert await stores.figures(window) == (900, 0, 0)


async def test_a_permit_carries_its_bucket_balances(stores):
    """Admission returns each charged bucket's balance after the reservation, the same
    in both stores (the remaining-limit headers come from it, no extra read)."""
    from gateway.governance import BUCKET_SCALE

    p = await principal(stores.keys, team="t1", limits=LIMITS)
    [permit] = await stores.gov.admit([request(p, usd=10, tokens=700, rid="b")])
    assert isinstance(permit, Permit)
    tpm = f"team:{p.team.id}:tpm"
    assert permit.buckets == {tpm: (100_000 - 700) * BUCKET_SCALE}
