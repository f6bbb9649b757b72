"""In-flight limits (a policy ``concurrency`` rule) in every store: local SQLite, the lease
profile's local store, shared Postgres (lone and coalesced/merged lanes).

An open permit is the slot: admission reserves 1 on the rule's ``…:inflight`` counter in
the same all-or-none step as every other charge, and every way a permit ends (complete,
tokens known, uncertain, invalid, cancelled, an operator's resolve) frees it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.governance import (
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
)
from gateway.keys import Principal, SqliteKeyStore, TeamLimits
from gateway.lease import LeaseGovernanceStore, LeaseState, apply_documents
from gateway.policy import PolicySnapshot, compile_documents
from gateway.pricing import Usage
from tests.integration._pg_helpers import principal, request, store_pair
from tests.settling import exact, settlement

pytestmark = pytest.mark.integration

LIMITS = TeamLimits(usd_micros_per_day=1_000_000)


def _doc(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
            "metadata": {"name": "slots"}, "spec": {"rules": list(rules)}}


def _rule(name: str, n: int, **subject: str) -> dict[str, Any]:
    return {"name": name, "subject": subject, "failurePolicy": "FailClosed",
            "concurrency": {"maxInFlight": n}}


@dataclass
class Stores:
    name: str
    keys: Any
    gov: Any
    lease: LeaseState | None = None

    async def snapshot(self, *rules: dict[str, Any]) -> PolicySnapshot:
        """The rules as the gateway of this profile would enforce them."""
        doc = _doc(*rules)
        if self.lease is not None:
            self.lease.applied = apply_documents({"slots": doc}, namespace="ns",
                                                 generation=1, fingerprint="f")
            return self.lease.applied.snapshot
        return PolicySnapshot(generation=await self.gov.current_generation(),
                              rules=compile_documents([doc]))

    async def held(self, counter: str) -> tuple[int, int, int]:
        """(committed, liability, reserved) of a counter (0s if never charged)."""
        row = await self.gov.counter(counter)
        if row is None:
            return 0, 0, 0
        if isinstance(row, dict):
            return row["committed"], row["liability"], row["reserved"]
        return row.committed, row.liability, row.reserved


@pytest.fixture(params=["local", "lease", "postgres", "postgres-merged"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    if request.param != "lease":
        async with store_pair(request.param, request, tmp_path, pool_max_size=6) as pair:
            yield Stores(request.param, *pair)
        return
    db = str(tmp_path / "mayu.db")
    state = LeaseState()
    gov, keys = LeaseGovernanceStore(db, state=state), SqliteKeyStore(db)
    await keys.open()
    await gov.open()
    try:
        yield Stores(request.param, keys, gov, state)
    finally:
        await gov.close()
        await keys.close()


def slot(permit: Permit) -> str:
    [name] = [c.counter for c in permit.request.charges if c.counter.endswith(":inflight")]
    return name


async def admit(s: Stores, p: Principal, snap: PolicySnapshot, rid: str,
                usd: int = 1_000) -> Permit | Refusal:
    [decided] = await s.gov.admit([request(p, usd=usd, tokens=100, rid=rid, snapshot=snap)])
    assert isinstance(decided, Permit | Refusal)
    return decided


async def test_the_fifth_concurrent_admission_is_refused_with_the_numbers(stores):
    """maxInFlight 4 on a key: of 5 concurrent admissions 4 get a slot, the 5th is a 429
    concurrency_limited (limit 4, 4 open, Retry-After 1) that reserved nothing anywhere."""
    p = await principal(stores.keys, team="t1", limits=LIMITS)
    snap = await stores.snapshot(_rule("k", 4, kind="key", key=p.key_id))
    decided = await asyncio.gather(*(admit(stores, p, snap, f"r{i}") for i in range(5)))
    permits = [d for d in decided if isinstance(d, Permit)]
    [refused] = [d for d in decided if isinstance(d, Refusal)]
    assert len(permits) == 4
    assert (refused.status, refused.code, refused.retry_after) == (
        429, "concurrency_limited", 1)
    assert refused.figures is not None
    assert (refused.figures.limit, refused.figures.reserved) == (4, 4)
    name = slot(permits[0])
    assert refused.reason == (f"{name}: in-flight limit 4 reached (4 requests open); "
                              "retry when one finishes")
    assert name == f"rule:slots/k:key={p.key_id}:inflight"
    assert await stores.held(name) == (0, 0, 4)
    [usd_day] = [c.counter for c in permits[0].request.charges if ":usd:day:" in c.counter]
    assert await stores.held(usd_day) == (0, 0, 4 * 1_000)  # the refused one charged nothing
    # Settled together (the coalesced lane batches them): every slot comes back.
    await asyncio.gather(*(stores.gov.settle(x.id, settlement(x.request, exact(10, 100)))
                           for x in permits))
    assert await stores.held(name) == (0, 0, 0)
    assert isinstance(await admit(stores, p, snap, "after"), Permit)


def _outcome(kind: OutcomeKind) -> Outcome:
    if kind is OutcomeKind.TOKENS_KNOWN:
        return Outcome(kind=OutcomeKind.COMPLETE,
                       usage=Usage(input=10, output=5, cache_write_unknown=20))
    if kind is OutcomeKind.COMPLETE:
        return Outcome(kind=kind, usage=Usage(input=10, output=5))
    if kind is OutcomeKind.UNCERTAIN:
        return Outcome(kind=kind, usage=Usage(input=10), detail="cut by the client")
    return Outcome(kind=kind, detail=str(kind))


@pytest.mark.parametrize("kind", list(OutcomeKind))
async def test_every_settlement_kind_frees_the_slot(stores, kind: OutcomeKind):
    """Limit 1: the second request is refused while the first is open and admitted once
    it is settled, whatever the outcome (an invalid one freezes money, still frees)."""
    p = await principal(stores.keys, team="t1", limits=LIMITS)
    snap = await stores.snapshot(_rule("one", 1, kind="key", key="*"))
    first = await admit(stores, p, snap, "a")
    assert isinstance(first, Permit)
    refused = await admit(stores, p, snap, "b")
    assert isinstance(refused, Refusal) and refused.code == "concurrency_limited"
    result = await stores.gov.settle(first.id, settlement(first.request, _outcome(kind)))
    assert result.kind is kind
    assert await stores.held(slot(first)) == (0, 0, 0)
    again = await admit(stores, p, snap, "b")
    if kind is OutcomeKind.INVALID:  # the money window froze: refused for that, not a slot
        assert isinstance(again, Refusal) and again.code == "account_frozen"
        assert await stores.held(slot(first)) == (0, 0, 0)
    else:
        assert isinstance(again, Permit)
        assert await stores.held(slot(first)) == (0, 0, 1)


async def test_resolve_frees_a_pending_slot_and_leaves_a_settled_one_free(stores):
    """``mayu permits resolve`` on a pending permit (a crashed replica's) settles it and
    frees its slot; resolving an uncertain permit later leaves the slot at 0."""
    p = await principal(stores.keys, team="t1", limits=LIMITS)
    snap = await stores.snapshot(_rule("one", 1, kind="key", key=p.key_id))
    first = await admit(stores, p, snap, "a")
    assert isinstance(first, Permit)
    await stores.gov.resolve(first.id, settlement(first.request, exact(10, 100)))
    assert await stores.held(slot(first)) == (0, 0, 0)
    second = await admit(stores, p, snap, "b")
    assert isinstance(second, Permit)
    await stores.gov.settle(second.id, settlement(second.request, _outcome(
        OutcomeKind.UNCERTAIN)))
    await stores.gov.resolve(second.id, settlement(second.request, exact(10, 100)))
    assert await stores.held(slot(second)) == (0, 0, 0)


async def test_team_user_and_key_rules_each_count_their_own_scope(stores):
    """A team rule counts every key of the team, a user rule only that user's keys, a key
    rule one key; a request takes a slot of every rule that applies, all or none."""
    a = await principal(stores.keys, team="t1", limits=LIMITS, user="ann")
    b = await principal(stores.keys, team="t1", limits=LIMITS, user="bob")
    snap = await stores.snapshot(_rule("team", 3, kind="team", team="t1"),
                                 _rule("user", 2, kind="user", user="ann"),
                                 _rule("key", 1, kind="key", key=b.key_id))
    assert isinstance(await admit(stores, a, snap, "a1"), Permit)
    assert isinstance(await admit(stores, a, snap, "a2"), Permit)
    ann_full = await admit(stores, a, snap, "a3")
    assert isinstance(ann_full, Refusal) and ann_full.counter == (
        "rule:slots/user:team=t1,user=ann:inflight")
    first_b = await admit(stores, b, snap, "b1")
    assert isinstance(first_b, Permit)
    assert {c.counter for c in first_b.request.charges if c.counter.endswith(":inflight")} \
        == {"rule:slots/team:team=t1:inflight", f"rule:slots/key:key={b.key_id}:inflight"}
    b_full = await admit(stores, b, snap, "b2")
    assert isinstance(b_full, Refusal) and b_full.code == "concurrency_limited"
    # The team holds 3 (a1, a2, b1); b2's refusal on its key took no team slot.
    assert await stores.held("rule:slots/team:team=t1:inflight") == (0, 0, 3)
