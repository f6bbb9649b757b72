"""Member and user budgets in every governance store: local SQLite, a lease plane's
store, Postgres and Postgres with merged (coalesced) admissions — the same all-or-none
admission as the key's and team's windows, the same refusal wording, and an edit that
re-plans admissions resolved before it."""

from __future__ import annotations

import asyncio

from gateway.governance import CounterKey, Permit, Refusal, utc_windows
from gateway.keys import MemberLimits, TeamLimits
from tests.integration._pg_helpers import NOW, principal
from tests.integration.test_inflight import Stores, admit, stores  # noqa: F401 (a fixture)
from tests.settling import exact, settlement

TEAM_DAY = 1_000_000


async def test_concurrent_admissions_never_pass_the_member_budget(stores: Stores) -> None:  # noqa: F811
    """ana may reserve 3,000 µUSD a day in a team of 1,000,000: of 5 concurrent
    admissions of 1,000 each on two of her keys, 3 are admitted and 2 refused naming her
    member counter with its figures; bob (same team, the default of 5,000) is admitted."""
    s = stores
    ana = await principal(s.keys, team="t1", limits=TeamLimits(usd_micros_per_day=TEAM_DAY),
                          user="ana")
    await s.keys.put_member("t1", "ana", limits=MemberLimits(usd_micros_per_day=3_000))
    await s.keys.put_member("t1", "*", limits=MemberLimits(usd_micros_per_day=5_000))
    ana = await principal(s.keys, team="t1", user="ana")  # resolved after the edits
    ana2 = await principal(s.keys, team="t1", user="ana")
    bob = await principal(s.keys, team="t1", user="bob")
    assert ana.member_limits == MemberLimits(usd_micros_per_day=3_000)
    assert bob.member_limits == MemberLimits(usd_micros_per_day=5_000)
    snap = await s.snapshot()
    decided = await asyncio.gather(*(admit(s, (ana, ana2)[i % 2], snap, f"r{i}")
                                     for i in range(5)))
    permits = [d for d in decided if isinstance(d, Permit)]
    refused = [d for d in decided if isinstance(d, Refusal)]
    assert len(permits) == 3 and len(refused) == 2
    day, _ = utc_windows(NOW)
    member = CounterKey.member(ana.team.id, "ana").windowed("usd", "day", day).text
    for r in refused:
        assert (r.status, r.code, r.counter) == (402, "budget_exhausted", member)
        assert r.reason == (f"{member}: limit 3000 µUSD would be exceeded: committed 0 + "
                            "liability 0 + reserved 3000 + this request's worst case 1000")
    assert await s.held(member) == (0, 0, 3_000)
    assert isinstance(await admit(s, bob, snap, "bob"), Permit)
    bob_window = CounterKey.member(bob.team.id, "bob").windowed("usd", "day", day).text
    assert await s.held(bob_window) == (0, 0, 1_000)
    await asyncio.gather(*(s.gov.settle(p.id, settlement(p.request, exact(10, 100)))
                           for p in permits))
    committed, liability, reserved = await s.held(member)
    assert (liability, reserved) == (0, 0) and 0 < committed <= 3_000


async def test_an_edit_re_plans_admissions_resolved_before_it(stores: Stores) -> None:  # noqa: F811
    """A principal resolved before a member or a user edit is refused as a snapshot
    mismatch naming its team (the ingress re-resolves and re-plans), never charged
    against the old budget."""
    s = stores
    p = await principal(s.keys, team="t1", user="ana")
    snap = await s.snapshot()
    await s.keys.put_member("t1", "ana", limits=MemberLimits(usd_micros_per_day=10))
    stale = await admit(s, p, snap, "stale")
    assert isinstance(stale, Refusal) and stale.code == "snapshot_mismatch"
    assert CounterKey.parse(stale.counter or "") == CounterKey.team(p.team.id)
    fresh = await principal(s.keys, team="t1", user="ana")
    refused = await admit(s, fresh, snap, "fresh")
    assert isinstance(refused, Refusal) and refused.code == "budget_exhausted"
    await s.keys.put_user("ana", limits=MemberLimits(tokens_per_day=50))
    stale_user = await admit(s, fresh, snap, "stale-user")
    assert isinstance(stale_user, Refusal) and stale_user.code == "snapshot_mismatch"
