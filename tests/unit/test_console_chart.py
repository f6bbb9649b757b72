"""The Usage page's arithmetic: the stacked bars and the query it reads (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from gateway.console._chart import periods, stacked
from gateway.console._usage import parse

SERIES = ["a", "b", "c"]
NOW = datetime(2026, 12, 5, 13, 30, tzinfo=UTC)


def _chart(values: dict[tuple[str, str], int], owed: dict[str, int], top: int | None = None):
    slots = [f"2026-12-0{d}" for d in range(1, 6)]
    return slots, stacked(slots, values, series=SERIES, label=str, show=str, top=top,
                          liability=owed)


amounts = st.integers(min_value=0, max_value=2**50)
figures = st.dictionaries(st.tuples(st.sampled_from([f"2026-12-0{d}" for d in range(1, 6)]),
                                    st.sampled_from(SERIES)), amounts, max_size=15)
owed_figures = st.dictionaries(st.sampled_from([f"2026-12-0{d}" for d in range(1, 6)]),
                               amounts, max_size=5)


@given(figures, owed_figures)
def test_every_figure_is_drawn_once_and_no_stack_overdraws(
        values: dict[tuple[str, str], int], owed: dict[str, int]) -> None:
    """Each nonzero figure is one rect carrying it exactly; a slot's rects never rise
    above the chart; the tallest stack fills it."""
    slots, chart = _chart(values, owed)
    drawn = {(r.period, r.series): r.value for r in chart.rects}
    wanted = {k: v for k, v in values.items() if v} | {
        (p, "liability"): v for p, v in owed.items() if v}
    assert drawn == wanted
    for p in slots:
        stack = [r for r in chart.rects if r.period == p]
        assert all(r.y >= -0.001 and r.y + r.height <= 100.001 for r in stack)
        assert sum(r.height for r in stack) <= 100.01
    if wanted:
        tallest = max(sum(r.height for r in chart.rects if r.period == p) for p in slots)
        assert abs(tallest - 100) < 0.01


def test_a_shared_scale_draws_the_same_figure_at_the_same_height() -> None:
    """Compare mode: two charts on one ``top`` — 500 µUSD is half the height of 1000."""
    _, one = _chart({("2026-12-01", "a"): 1000}, {}, top=1000)
    _, two = _chart({("2026-12-01", "a"): 500}, {}, top=1000)
    assert one.rects[0].height == 100 and two.rects[0].height == 50


def test_periods_cover_the_range_empty_ones_included() -> None:
    """Every hour (or day) from the start until the end, as the summary labels them."""
    hours = periods(NOW - timedelta(hours=3), NOW, "hour")
    assert hours == ["2026-12-05T10", "2026-12-05T11", "2026-12-05T12", "2026-12-05T13"]
    assert periods(NOW - timedelta(days=2), NOW, "day") == [
        "2026-12-03", "2026-12-04", "2026-12-05"]


def test_the_default_range_is_30_days_by_day_and_a_week_by_the_hour() -> None:
    """No input: the last 30 UTC days by day; a range of 7 days or less: by the hour
    unless a bucket is chosen; bad input is a message per field, never an exception."""
    q, errors = parse({}, admin=True, now=NOW)
    assert not errors and q.bucket == "day" and q.since == datetime(2026, 11, 6, tzinfo=UTC)
    q, errors = parse({"since": "2026-11-29"}, admin=True, now=NOW)
    assert not errors and q.bucket == "hour"
    q, errors = parse({"since": "2026-11-29", "bucket": "day"}, admin=True, now=NOW)
    assert q.bucket == "day"
    _, errors = parse({"since": "soon", "group": "route", "compare": "team", "a": "x"},
                      admin=True, now=NOW)
    assert set(errors) == {"since", "group", "b"}
    _, errors = parse({"group": "key"}, admin=False, now=NOW)
    assert set(errors) == {"group"}  # a key holder stacks by model, tool or user only
