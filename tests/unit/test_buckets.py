"""Token-bucket arithmetic (exact fixed point): refill, admission, true-up, retry-after."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.governance import (
    BUCKET_SCALE,
    bucket_admits,
    bucket_settle,
    refill,
    retry_after_seconds,
)

capacities = st.integers(min_value=1, max_value=1 << 36)
micros = st.integers(min_value=0, max_value=10 * 60 * 1_000_000)


@st.composite
def bucket(draw):
    """A capacity and a balance anywhere from deep debt to full."""
    cap = draw(capacities)
    full = cap * BUCKET_SCALE
    return cap, draw(st.integers(min_value=-10 * full, max_value=full))


@given(bucket(), st.lists(micros, max_size=20))
def test_refill_over_split_intervals_equals_refill_over_the_whole(b, intervals):
    """Refilling step by step gives exactly what one refill over the sum gives."""
    cap, balance = b
    stepwise = balance
    for dt in intervals:
        stepwise = refill(stepwise, cap, dt)
    assert stepwise == refill(balance, cap, sum(intervals))


@given(bucket(), micros)
def test_refill_never_exceeds_capacity(b, dt):
    """A bucket never holds more than its capacity, however long it idles."""
    cap, balance = b
    assert refill(balance, cap, dt) <= cap * BUCKET_SCALE


@given(bucket(), micros)
def test_refill_is_exact_integer_arithmetic(b, dt):
    """Capacity C refills exactly C scaled units per microsecond (no rounding lost)."""
    cap, balance = b
    result = refill(balance, cap, dt)
    assert type(result) is int
    assert result == min(cap * BUCKET_SCALE, balance + cap * dt)


@given(bucket())
def test_debt_is_repaid_by_refill(b):
    """A bucket in debt is back at zero or above after debt / capacity microseconds."""
    cap, balance = b
    if balance >= 0:
        return
    needed = -(balance // cap)  # ceil(debt / cap): balance is negative
    assert refill(balance, cap, needed) >= 0
    assert refill(balance, cap, needed - 1) < 0


@given(bucket(), st.integers(min_value=0, max_value=1 << 36),
       st.integers(min_value=0, max_value=1 << 40))
def test_true_up_never_credits_above_capacity(b, reserved, committed):
    """bucket_settle credits unused tokens back but never above capacity."""
    cap, balance = b
    assert bucket_settle(balance, cap, reserved, committed) <= cap * BUCKET_SCALE


@given(bucket(), st.integers(min_value=0, max_value=1 << 36),
       st.integers(min_value=0, max_value=1 << 36))
def test_true_up_debits_the_whole_excess_into_debt(b, reserved, extra):
    """An under-estimate is debited in full, even below zero (ADR-039: no floor)."""
    cap, balance = b
    committed = reserved + extra
    assert bucket_settle(balance, cap, reserved, committed) == min(
        cap * BUCKET_SCALE, balance - extra * BUCKET_SCALE)


@given(bucket(), st.integers(min_value=0, max_value=1 << 37))
def test_retry_after_is_enough_and_not_a_second_too_long(b, amount):
    """After retry_after seconds the bucket admits the amount; a second earlier it did not
    (unless the answer is the 1-second minimum)."""
    cap, balance = b
    wait = retry_after_seconds(balance, cap, amount)
    if bucket_admits(balance, cap, amount):
        assert wait == 0
        return
    assert bucket_admits(refill(balance, cap, wait * 1_000_000), cap, amount)
    if wait > 1:
        assert not bucket_admits(refill(balance, cap, (wait - 1) * 1_000_000), cap, amount)


def test_oversize_requests_need_a_full_bucket_and_leave_debt():
    """A request above capacity is admitted only from a full bucket."""
    cap = 100
    assert bucket_admits(cap * BUCKET_SCALE, cap, 250)
    assert not bucket_admits(cap * BUCKET_SCALE - 1, cap, 250)
    assert not bucket_admits(50 * BUCKET_SCALE, cap, 51)
    assert bucket_admits(50 * BUCKET_SCALE, cap, 50)


@given(bucket(), st.integers(min_value=0, max_value=1 << 20),
       st.integers(min_value=0, max_value=1 << 20), st.integers(min_value=0, max_value=1 << 36))
def test_release_never_beats_reserving_only_what_was_used(b, reserved, used, held_us):
    """Settling a reservation leaves at most the balance a reservation of only the used
    tokens would have left, however long it was held; settled at once, exactly that."""
    cap, start = b
    used = min(used, reserved)
    held = refill(start - reserved * BUCKET_SCALE, cap, held_us)
    settled = bucket_settle(held, cap, reserved, used, held_us=held_us)
    assert settled <= refill(start - used * BUCKET_SCALE, cap, held_us)
    if held_us == 0:
        assert settled == min(cap * BUCKET_SCALE, start - used * BUCKET_SCALE)


def test_old_reservation_refund_does_not_double_a_minute():
    """A minute-old unused reservation, released after refill repaid it, adds nothing."""
    cap = 1000
    balance = cap * BUCKET_SCALE - cap * BUCKET_SCALE  # A reserves the whole bucket
    balance = refill(balance, cap, 60_000_000)  # one minute later: full again
    assert bucket_admits(balance, cap, cap)
    balance -= cap * BUCKET_SCALE  # B takes it all
    balance = bucket_settle(balance, cap, cap, 0, held_us=60_000_000)  # A used nothing
    assert not bucket_admits(balance, cap, 1)  # C must wait
