"""The ledger's arithmetic refuses what only a lying or broken plane reports (issue 25):
committed going backwards within a frame is refused, never adopted, so a plane reporting
10, 0, 10, 0 … cannot turn a budget it never spent into liability."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.lease._ledger import Account, LedgerRow, Report, WentBackwards, adopt, sync


@given(committed=st.integers(min_value=1, max_value=10**9),
       lower=st.integers(min_value=0, max_value=10**9), allowance=st.integers(0, 10**9))
def test_a_lower_committed_figure_in_one_frame_is_refused(
        committed: int, lower: int, allowance: int) -> None:
    """Any report below the frame's committed figure raises and adopts nothing."""
    row = LedgerRow(frame="f", committed=committed, allowance=max(allowance, committed))
    with pytest.raises(WentBackwards):
        adopt(row, Report(frame="f", committed=min(lower, committed - 1)))


def test_the_ten_zero_reporter_burns_nothing() -> None:
    """10, 0, 10, 0 … with want = the limit: every backwards report is refused, the
    account binds only the one grant of the first report, and the budget stays spendable."""
    limit = 1_000_000
    result = sync(LedgerRow(), Report(frame="f", committed=10), Account(), limit=limit,
                  grant=20_000, want=limit)
    row, account = result.row, result.account
    for committed in (0, 10, 0, 10, 0):
        try:
            result = sync(row, Report(frame="f", committed=committed), account, limit=limit,
                          grant=20_000, want=limit)
        except WentBackwards:
            continue
        row, account = result.row, result.account
    assert row.adoptions == 0 and row.prior_unobserved == 0
    assert account.liability == 0 and account.committed == 10
    assert account.bound == row.allowance == limit  # one grant, still the plane's to spend
