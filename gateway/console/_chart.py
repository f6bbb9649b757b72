"""The Usage page's chart: stacked bars over time, drawn by the server as inline SVG.

No chart library and no script: the server lays out integer figures from the API as
``<rect>`` elements (each with a ``<title>`` naming its series, period and exact figure,
and ``data-value``, so a test or a screen reader reads what was drawn) under the
console's strict Content-Security-Policy. Colours are SVG ``fill`` attributes, not
inline styles. Every period of the range is a slot, an empty one included, so a gap
in spend shows as a gap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

PALETTE = ("#0b5cad", "#2e8540", "#8250df", "#bf3989", "#1b7c83", "#9a6700", "#57606a",
           "#cf222e")
LIABILITY = "#b35900"
_SLOT, _HEIGHT = 10.0, 100.0
_MAX_SLOTS = 24 * 93
"""The most periods one chart draws (a quarter by the hour); the page refuses more."""


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    width: float
    height: float
    fill: str
    series: str
    period: str
    value: int
    title: str


@dataclass(frozen=True)
class Chart:
    """One chart: its rects in a ``width`` × 100 viewBox, its largest stack, its legend."""

    width: float
    rects: list[Rect]
    top: int
    first: str
    last: str
    legend: list[tuple[str, str]] = field(default_factory=list)


def periods(start: datetime, end: datetime, bucket: str) -> list[str]:
    """Every period label (as the summary writes it) from ``start`` until ``end``."""
    step = timedelta(hours=1) if bucket == "hour" else timedelta(days=1)
    at = start.replace(minute=0, second=0, microsecond=0)
    if bucket == "day":
        at = at.replace(hour=0)
    fmt = "%Y-%m-%dT%H" if bucket == "hour" else "%Y-%m-%d"
    out: list[str] = []
    while at < end and len(out) <= _MAX_SLOTS:
        out.append(at.strftime(fmt))
        at += step
    return out


def too_many(count: int) -> bool:
    return count > _MAX_SLOTS


def stacked(slots: list[str], values: dict[tuple[str, str], int], *,
            series: list[str], label: Callable[[str], str],
            show: Callable[[int], str], top: int | None = None,
            liability: dict[str, int] | None = None) -> Chart:
    """Bars of ``values[(period, series)]`` stacked in ``series`` order, one slot per
    period, with ``liability[period]`` (if given) on top of each; scaled so the
    tallest stack (or ``top``, to share a scale between two charts) is full height."""
    extra = liability or {}
    tallest = max([_stack(values, p, series) + extra.get(p, 0) for p in slots] + [0])
    top = max(top or 0, tallest)
    colour = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(series)}
    rects: list[Rect] = []
    for i, p in enumerate(slots):
        base = 0
        parts: Iterable[tuple[str, int, str]] = (
            *((s, values.get((p, s), 0), colour[s]) for s in series),
            ("liability", extra.get(p, 0), LIABILITY))
        for name, value, fill in parts:
            if value <= 0:
                continue
            height = _HEIGHT * value / top
            y = _HEIGHT - _HEIGHT * (base + value) / top
            shown = "liability" if name == "liability" else label(name)
            rects.append(Rect(x=round(i * _SLOT + 1, 3), y=round(y, 3),
                              width=_SLOT - 2, height=round(height, 3), fill=fill,
                              series=name, period=p, value=value,
                              title=f"{shown} · {p}: {show(value)}"))
            base += value
    legend = [(label(s), colour[s]) for s in series]
    if extra and any(extra.values()):
        legend.append(("liability", LIABILITY))
    return Chart(width=max(len(slots), 1) * _SLOT, rects=rects, top=top,
                 first=slots[0] if slots else "", last=slots[-1] if slots else "",
                 legend=legend)


def _stack(values: dict[tuple[str, str], int], period: str, series: list[str]) -> int:
    return sum(values.get((period, s), 0) for s in series)
