"""How the console writes figures: every number with its unit, money exactly.

Money is integer µUSD in the API and stays an ``int`` here: ``1234567`` is shown as
``1,234,567 µUSD ($1.234567)`` — the dollars are the same integer split at six digits,
never a float. A bar is the server's arithmetic on those integers, drawn as an inline
SVG (no script, no chart library) with the figures written beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any


def dollars(micros: int) -> str:
    """``$1.234567`` for 1234567 µUSD: exact, six decimals."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), 1_000_000)
    return f"{sign}${whole:,}.{frac:06d}"


def money(micros: Any) -> str:
    if micros is None:
        return "—"
    return f"{int(micros):,} µUSD ({dollars(int(micros))})"


def count(value: Any, unit: str) -> str:
    """``1,234 tokens``; one of a plural unit is singular (``1 request``, ``1 token/min``)."""
    if value is None:
        return "—"
    if int(value) == 1:
        head, slash, tail = unit.partition("/")
        unit = head.removesuffix("s") + slash + tail
    return f"{int(value):,} {unit}"


def amount(value: Any, dimension: str) -> str:
    """A figure of a counter of ``dimension`` (``usd``, ``tokens``, ``requests``)."""
    return money(value) if dimension == "usd" else count(value, dimension)


_LIMIT_UNITS = {"rpm": "requests/min", "tpm": "tokens/min", "tokens_per_day": "tokens/day",
                "budget_fit_floor": "tokens"}


def limit(value: Any, field: str) -> str:
    """A configured limit by its field name: money for ``usd_*``, else with its unit."""
    if value is None:
        return "no cap"
    return money(value) if field.startswith("usd") else count(value, _LIMIT_UNITS[field])


def moment(value: Any) -> str:
    """An RFC 3339 time as ``2026-12-04 18:40:12 UTC`` (seconds; the API has more)."""
    if not value:
        return "—"
    try:
        at = datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return str(value)
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def moment_short(value: Any) -> str:
    """:func:`moment` without the zone, for a column whose header says UTC."""
    return moment(value).removesuffix(" UTC")


@dataclass(frozen=True)
class Segment:
    part: str
    x: float
    width: float


def bar(*, committed: int, liability: int, reserved: int,
        limit: int | None) -> list[Segment]:
    """Committed, liability and reserved side by side as percents of the limit (of
    their sum when there is none), cut at 100; an ``over`` mark past the limit."""
    total = committed + liability + reserved
    scale = limit if limit else max(total, 1)
    segments: list[Segment] = []
    x = 0.0
    for part, value in (("committed", committed), ("liability", liability),
                        ("reserved", reserved)):
        width = min(100.0 - x, 100.0 * value / scale) if scale else 0.0
        if width > 0:
            segments.append(Segment(part, round(x, 3), round(width, 3)))
            x += width
    if limit is not None and total > limit:
        segments.append(Segment("over", 99.0, 1.0))
    return segments


def rows(n: int) -> str:
    """``1 row``, ``2 rows``."""
    return f"{n:,} row{'' if n == 1 else 's'}"


def window_resets(today: date) -> tuple[str, str]:
    """When the UTC day and month of ``today`` end (their counters start over)."""
    tomorrow = today + timedelta(days=1)
    first = (today.replace(day=1) + timedelta(days=32)).replace(day=1)
    return f"{tomorrow.isoformat()}T00:00:00Z", f"{first.isoformat()}T00:00:00Z"


FILTERS = {"money": money, "dollars": dollars, "count": count, "amount": amount,
           "limit": limit, "moment": moment, "moment_short": moment_short, "rows": rows}
