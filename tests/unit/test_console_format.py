"""The console's figures: µUSD shown as dollars exactly, bars that never overdraw."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from gateway.console._format import (
    bar,
    count,
    dollars,
    moment_short,
    money,
    rows,
    window_resets,
)

AMOUNT = st.integers(min_value=0, max_value=2**50)


@given(st.integers(min_value=-(2**50), max_value=2**50))
def test_dollars_are_the_micros_exactly(micros: int) -> None:
    """``$`` figure × 10^6 is the µUSD integer again: six decimals, no float."""
    shown = dollars(micros)
    assert Decimal(shown.replace("$", "").replace(",", "")) * 1_000_000 == micros
    assert money(micros).startswith(f"{micros:,} µUSD (")


@given(AMOUNT, AMOUNT, AMOUNT, st.none() | st.integers(min_value=1, max_value=2**50))
def test_a_bar_never_draws_past_its_end(committed: int, liability: int, reserved: int,
                                        limit: int | None) -> None:
    """Segments are adjacent, at most 100 % together, and marked over past the limit."""
    parts = bar(committed=committed, liability=liability, reserved=reserved, limit=limit)
    drawn = [p for p in parts if p.part != "over"]
    assert sum(p.width for p in drawn) <= 100.01
    total = committed + liability + reserved
    assert any(p.part == "over" for p in parts) == (limit is not None and total > limit)


def test_windows_reset_at_the_next_utc_midnight_and_first_of_month() -> None:
    """31 December: the day resets on 1 January, the month too."""
    assert window_resets(date(2026, 12, 31)) == ("2027-01-01T00:00:00Z",
                                                 "2027-01-01T00:00:00Z")
    assert window_resets(date(2026, 1, 31))[1] == "2026-02-01T00:00:00Z"


def test_one_of_a_counted_unit_is_singular() -> None:
    assert count(1, "requests") == "1 request"
    assert count(1, "tokens/min") == "1 token/min"
    assert count(0, "requests") == "0 requests"
    assert count(12_345, "tokens") == "12,345 tokens"
    assert count(None, "tokens") == "—"


def test_a_row_count_agrees_with_its_number_and_a_table_time_drops_its_zone() -> None:
    """``1 row`` (it read "(1 rows)"), ``2 rows``, ``1,000 rows``; a time in a column
    headed UTC is written without the zone."""
    assert [rows(n) for n in (0, 1, 2, 1000)] == ["0 rows", "1 row", "2 rows", "1,000 rows"]
    assert moment_short("2026-12-04T18:40:12.5Z") == "2026-12-04 18:40:12"
