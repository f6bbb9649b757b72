"""Property tests of the lease ledger's arithmetic (gateway.lease._ledger, ADR-034 §2).

``sql/lease.sql`` executes the same arithmetic; tests/integration/test_lease_sql.py
checks the SQL against these functions. Here the invariants are stated on the pure
functions: grants never take an account past its limit, retried heartbeats grant nothing
twice, a restarted plane's old allowance is never spent again (a lower figure within a
frame is refused: tests/unit/test_lease_trust_ledger.py), and — in a simulation of
planes, lost answers, restarts and shared admissions on one account — what is really
spent or in flight never exceeds the limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.lease._ledger import (
    Account,
    LedgerRow,
    Report,
    adopt,
    contribution,
    next_allowance,
    sync,
)

amounts = st.integers(min_value=0, max_value=10**9)
limits = st.integers(min_value=0, max_value=10**9)


@st.composite
def rows(draw: st.DrawFn) -> LedgerRow:
    committed, liability, reserved = draw(amounts), draw(amounts), draw(amounts)
    held = committed + liability + reserved
    return LedgerRow(frame=draw(st.sampled_from(["", "f1", "f2"])), committed=committed,
                     liability=liability, reserved=reserved,
                     allowance=draw(st.integers(min_value=0, max_value=held + 10**9)),
                     prior_committed=draw(amounts), prior_unobserved=draw(amounts))


@st.composite
def reports(draw: st.DrawFn, row: LedgerRow) -> Report:
    same_frame = draw(st.booleans())
    frame = row.frame if same_frame else draw(st.sampled_from(["f1", "f2", "f3"]))
    # Within a frame committed only grows (a lower figure is refused: test_lease_trust_*).
    low = row.committed if frame == row.frame else 0
    committed = draw(st.integers(min_value=low, max_value=row.committed + 10**9))
    return Report(frame=frame, committed=committed, liability=draw(amounts),
                  reserved=draw(amounts))


def account_for(row: LedgerRow, extra: Account) -> Account:
    """An account whose sums hold ``row``'s contribution plus ``extra``'s figures."""
    c = contribution(row)
    return Account(committed=extra.committed + c.committed,
                   liability=extra.liability + c.liability, reserved=extra.reserved,
                   leased_outstanding=extra.leased_outstanding + c.outstanding)


others_st = st.builds(Account, committed=amounts, liability=amounts, reserved=amounts,
                      leased_outstanding=amounts)


@given(data=st.data(), row=rows(), extra=others_st, limit=limits,
       grant=st.integers(min_value=0, max_value=10**8), open_=st.booleans())
def test_a_grant_never_takes_the_account_past_its_limit(
        data: st.DataObject, row: LedgerRow, extra: Account, limit: int, grant: int,
        open_: bool) -> None:
    """After a sync the account binds no more than its limit, unless what it already bound
    (the reports and earlier allowances) was past it; then the sync grants nothing new."""
    report = data.draw(reports(row))
    account = account_for(row, extra)
    result = sync(row, report, account, limit=limit, grant=grant, open_=open_)
    adopted = adopt(row, report)
    without_grant = sync(row, report, account, limit=limit, grant=0, open_=False)
    assert result.account.bound <= max(limit, without_grant.account.bound)
    assert result.row.allowance >= adopted.allowance
    assert result.row.allowance >= adopted.held


@given(data=st.data(), row=rows(), extra=others_st, limit=limits,
       grant=st.integers(min_value=0, max_value=10**8))
def test_a_retried_heartbeat_grants_nothing_twice(
        data: st.DataObject, row: LedgerRow, extra: Account, limit: int, grant: int) -> None:
    """The same report applied twice (a heartbeat whose answer was lost) leaves the row and
    the account exactly as applying it once did."""
    report = data.draw(reports(row))
    once = sync(row, report, account_for(row, extra), limit=limit, grant=grant)
    twice = sync(once.row, report, once.account, limit=limit, grant=grant)
    assert twice.row == once.row
    assert twice.account == once.account


@given(data=st.data(), row=rows(), extra=others_st, limit=limits,
       grant=st.integers(min_value=0, max_value=10**8))
def test_the_account_sums_follow_the_row(
        data: st.DataObject, row: LedgerRow, extra: Account, limit: int, grant: int) -> None:
    """committed, liability and leased_outstanding move by exactly the row's change: the
    account keeps holding every other figure as it was."""
    report = data.draw(reports(row))
    result = sync(row, report, account_for(row, extra), limit=limit, grant=grant)
    assert result.account == account_for(result.row, extra)


@given(row=rows(), committed=amounts)
def test_within_a_frame_the_allowance_never_decreases(row: LedgerRow, committed: int) -> None:
    """A later report in the same frame keeps at least the allowance already granted."""
    report = Report(frame=row.frame, committed=row.committed + committed)
    adopted = adopt(row, report)
    assert adopted.allowance == row.allowance
    allowance, _ = next_allowance(adopted, limit=0, others=10**12, size=10, open_=True)
    assert allowance >= row.allowance


@given(row=rows(), committed=amounts)
def test_fresh_counters_never_respend_the_old_allowance(
        row: LedgerRow, committed: int) -> None:
    """A new frame keeps the old committed as spend and the rest of the old footprint as
    unobserved, and starts the new frame at no allowance."""
    adopted = adopt(row, Report(frame=row.frame + "-new", committed=committed))
    assert adopted.allowance == 0
    assert adopted.prior_committed == row.prior_committed + row.committed
    assert adopted.prior_unobserved == row.prior_unobserved + row.footprint - row.committed
    before, after = contribution(row), contribution(adopted)
    assert after.committed + after.liability >= before.committed + before.liability + (
        before.outstanding)


def test_allowance_is_spent_plus_grant_when_the_budget_has_room() -> None:
    """ADR-034's formula: allowance′ = spent + min(grant, remaining)."""
    row = LedgerRow(frame="f")
    result = sync(row, Report(frame="f", committed=300), Account(), limit=10_000, grant=1_000)
    assert result.row.allowance == 1_300
    assert result.remaining == 10_000 - 1_300
    other = sync(LedgerRow(frame="g"), Report(frame="g", committed=0), result.account,
                 limit=10_000, grant=10_000)
    assert other.row.allowance == 10_000 - 1_300
    assert other.remaining == 0


def test_want_raises_the_grant_to_a_refused_charge() -> None:
    """A plane that refused a charge larger than the grant size gets enough for it."""
    result = sync(LedgerRow(), Report(frame="f", committed=0), Account(), limit=10_000,
                  grant=10, want=2_500)
    assert result.row.allowance == 2_500


@dataclass
class _Plane:
    frame: int = 0
    committed: int = 0
    inflight: list[int] = field(default_factory=list)
    allowance: int = 0
    answer: int | None = None
    """An answer in flight: the plane keeps admitting on its old allowance meanwhile."""
    row: LedgerRow = field(default_factory=LedgerRow)

    @property
    def held(self) -> int:
        return self.committed + sum(self.inflight)


_ops = st.lists(st.tuples(
    st.sampled_from(["admit", "settle", "hb", "hb_lost", "answer", "restart",
                     "shared_admit", "shared_settle"]),
    st.integers(min_value=0, max_value=2), st.integers(min_value=0, max_value=400),
    st.integers(min_value=0, max_value=100)), max_size=120)


@settings(max_examples=300)
@given(ops=_ops, limit=st.integers(min_value=0, max_value=2_000),
       grant=st.integers(min_value=1, max_value=500))
def test_planes_and_shared_admissions_never_exceed_the_limit(
        ops: list[tuple[str, int, int, int]], limit: int, grant: int) -> None:
    """Three planes (answers that arrive late or never, restarts that lose their counters
    and in-flight work) and shared admissions on one account: what is spent or in flight
    never exceeds the limit, and the account always binds at least that much."""
    planes = [_Plane() for _ in range(3)]
    account = Account()
    shared: list[int] = []
    spent = 0  # every µUSD really committed, by anyone, in any frame
    for op, p, amount, pct in ops:
        plane = planes[p]
        if op == "admit" and plane.held + amount <= plane.allowance:
            plane.inflight.append(amount)
        elif op == "settle" and plane.inflight:
            cost = plane.inflight.pop(0) * pct // 100
            plane.committed += cost
            spent += cost
        elif op in ("hb", "hb_lost"):
            report = Report(frame=str(plane.frame), committed=plane.committed,
                            reserved=sum(plane.inflight))
            # pct < 30: the plane releases — admits nothing beyond its cap from now
            # (what it holds) until an answer, as the plane freezes its lease.
            cap = report.committed + report.reserved if pct < 30 else None
            if cap is not None:
                plane.allowance = min(plane.allowance, cap)
            result = sync(plane.row, report, account, limit=limit, grant=grant, want=amount,
                          need=amount * pct // 100, cap=cap)
            plane.row, account = result.row, result.account
            plane.answer = result.row.allowance if op == "hb" else None
        elif op == "answer" and plane.answer is not None:
            plane.allowance, plane.answer = plane.answer, None
        elif op == "restart":
            spent += sum(plane.inflight)  # worst case: everything in flight was spent
            planes[p] = _Plane(frame=plane.frame + 1, row=plane.row)
        elif op == "shared_admit" and account.bound + amount <= limit:
            account = Account(committed=account.committed, liability=account.liability,
                              reserved=account.reserved + amount,
                              leased_outstanding=account.leased_outstanding)
            shared.append(amount)
        elif op == "shared_settle" and shared:
            reserved = shared.pop(0)
            cost = reserved * pct // 100
            account = Account(committed=account.committed + cost, liability=account.liability,
                              reserved=account.reserved - reserved,
                              leased_outstanding=account.leased_outstanding)
            spent += cost
        exposure = spent + sum(sum(q.inflight) for q in planes) + sum(shared)
        assert exposure <= limit
        assert account.bound >= exposure


def test_an_allowance_is_not_lowered_under_work_admitted_before_the_answer() -> None:
    """A plane whose held figure fell (a reservation settled cheaply) keeps its allowance:
    it may already have admitted up to it before the answer arrives, so lowering it would
    let another plane be granted the same µUSD."""
    a = sync(LedgerRow(), Report(frame="a", committed=0, reserved=100), Account(),
             limit=300, grant=100)
    assert a.row.allowance == 200
    # The reservation settled at 0; the plane reports held 0 and, before this answer
    # arrives, admits 200 on the allowance it holds.
    a2 = sync(a.row, Report(frame="a", committed=0), a.account, limit=300, grant=100)
    assert a2.row.allowance == 200
    b = sync(LedgerRow(), Report(frame="b", committed=0), a2.account, limit=300, grant=300)
    assert a2.row.allowance + b.row.allowance <= 300


def test_a_released_allowance_returns_to_the_budget_and_grants_exactly_want() -> None:
    """A cap lowers the allowance to max(cap, held) at once (no window end needed), the
    grant is the plane's want without the rule's floor, and a grant smaller than the
    refused charge (need) is not given: that piece stays in the pool."""
    a = sync(LedgerRow(), Report(frame="a", committed=0), Account(), limit=1_000,
             grant=10, want=600)
    assert a.row.allowance == 600
    released = sync(a.row, Report(frame="a", committed=100), a.account, limit=1_000,
                    grant=10, cap=100)
    assert released.row.allowance == 100 and released.remaining == 900
    b = sync(LedgerRow(), Report(frame="b", committed=0), released.account, limit=1_000,
             grant=10, want=900)
    assert b.row.allowance == 900
    # a asks for 300 while the pool has 0 left: nothing (not a useless piece)
    short = sync(released.row, Report(frame="a", committed=100), b.account, limit=1_000,
                 grant=10, want=300, need=300, cap=100)
    assert short.row.allowance == 100
    # the cap never goes under what the plane holds
    over = sync(a.row, Report(frame="a", committed=0, reserved=500), a.account,
                limit=1_000, grant=10, cap=200)
    assert over.row.allowance == 500
