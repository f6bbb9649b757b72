"""Member and user budgets in every governance store: local SQLite, a lease plane's
store, Postgres and Postgres with merged (coalesced) admissions — the same all-or-none
admission as the key's and team's windows, the same refusal wording, an edit that
re-plans admissions resolved before it, and day and month windows across UTC midnight
and a new month (the clock moved as the ingress would: requests planned at given times)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from gateway.governance import CounterKey, Permit, Refusal, utc_windows
from gateway.keys import MemberLimits, Principal, TeamLimits
from gateway.policy import PolicySnapshot
from tests.integration._pg_helpers import NOW, principal, request
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


LAST_SECOND = datetime(2026, 11, 29, 23, 59, 59, tzinfo=UTC)
MIDNIGHT = datetime(2026, 11, 30, tzinfo=UTC)
"""The next UTC day, in the same month."""
NEXT_MONTH = datetime(2026, 12, 1, tzinfo=UTC)
BUDGET = MemberLimits(usd_micros_per_day=3_000, usd_micros_per_month=5_000)


async def _spend(s: Stores, p: Principal, snap: PolicySnapshot, rid: str,
                 at: datetime) -> Permit | Refusal:
    """A request of 1,000 µUSD worst case admitted at ``at`` (the windows it charges are
    ``at``'s, as the ingress plans them from its clock) and, if admitted, settled at
    exactly 1,000."""
    [decided] = await s.gov.admit([request(p, usd=1_000, tokens=100, rid=rid,
                                           snapshot=snap, now=at)])
    if isinstance(decided, Permit):
        await s.gov.settle(decided.id, settlement(decided.request, exact(10, 1_000)))
    assert isinstance(decided, Permit | Refusal)
    return decided


def _refused_by(decided: Permit | Refusal, counter: str, limit: int, committed: int) -> None:
    assert isinstance(decided, Refusal), decided
    assert (decided.status, decided.code, decided.counter) == (402, "budget_exhausted",
                                                                counter)
    assert decided.reason == (f"{counter}: limit {limit} µUSD would be exceeded: committed "
                              f"{committed} + liability 0 + reserved 0 + this request's "
                              "worst case 1000")


async def _across_midnight(s: Stores, first: Principal, then: Principal,
                           budget: CounterKey) -> None:
    """``BUDGET`` on ``budget`` (a member's or a user's): 3 requests on the last second
    of a day, the 4th refused by the day; 2 from midnight on ``then``, the 3rd refused by
    the month though the day has room; 1 December admits again on fresh windows."""
    snap = await s.snapshot()

    def window(kind: str, at: datetime) -> str:
        day, month = utc_windows(at)
        return budget.windowed("usd", "day" if kind == "day" else "month",
                               day if kind == "day" else month).text

    for i in range(3):
        assert isinstance(await _spend(s, first, snap, f"d1-{i}", LAST_SECOND), Permit)
    _refused_by(await _spend(s, first, snap, "d1-3", LAST_SECOND),
                window("day", LAST_SECOND), 3_000, 3_000)
    for i in range(2):
        assert isinstance(await _spend(s, then, snap, f"d2-{i}", MIDNIGHT), Permit)
    _refused_by(await _spend(s, then, snap, "d2-2", MIDNIGHT),
                window("month", MIDNIGHT), 5_000, 5_000)
    assert await s.held(window("day", LAST_SECOND)) == (3_000, 0, 0)
    assert await s.held(window("day", MIDNIGHT)) == (2_000, 0, 0)
    assert await s.held(window("month", MIDNIGHT)) == (5_000, 0, 0)

    assert isinstance(await _spend(s, then, snap, "m2", NEXT_MONTH), Permit)
    assert await s.held(window("day", NEXT_MONTH)) == (1_000, 0, 0)
    assert await s.held(window("month", NEXT_MONTH)) == (1_000, 0, 0)
    assert await s.held(window("month", MIDNIGHT)) == (5_000, 0, 0)


async def test_a_members_month_counts_earlier_days_while_its_day_resets_at_midnight(
        stores: Stores) -> None:  # noqa: F811
    """ana's member budget, 3,000 µUSD a day and 5,000 a month: her day window refuses the
    fourth 1,000 on the 29th and starts afresh at UTC midnight, her month window counts
    the 29th's 3,000 and refuses the third of the 30th, naming the counter and its
    figures; a new month resets both."""
    s = stores
    await principal(s.keys, team="t1", limits=TeamLimits(usd_micros_per_day=TEAM_DAY))
    await s.keys.put_member("t1", "ana", limits=BUDGET)
    ana = await principal(s.keys, team="t1", user="ana")
    assert ana.member_limits == BUDGET
    await _across_midnight(s, ana, ana, CounterKey.member(ana.team.id, "ana"))


async def test_a_users_month_counts_earlier_days_in_any_team(stores: Stores) -> None:  # noqa: F811
    """ana's user budget, 3,000 µUSD a day and 5,000 a month across teams: spent in team a
    on the 29th, it still counts on the 30th in team b, whose day admits her until the
    month is full; a new month resets both."""
    s = stores
    await s.keys.put_user("ana", limits=BUDGET)
    in_a = await principal(s.keys, team="a", user="ana")
    in_b = await principal(s.keys, team="b", user="ana")
    await _across_midnight(s, in_a, in_b, CounterKey.user("ana"))
