"""Today's and this month's spend per user or per key, as the summary API adds it up.

One ``GET /admin/v1/requests/summary?group_by=<user|key>&bucket=day&since=<1st of the
month>`` (``&team=`` for one team): the day rows of this UTC month, summed per group for
the month and kept as they are for today. No figure comes from anywhere else.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gateway.console._client import Api, ApiRefused

SUMS = ("requests", "usd_committed", "usd_liability", "tokens_committed",
        "tokens_liability")
ZERO = dict.fromkeys(SUMS, 0)


async def spend_by(api: Api, group: str, *,
                   team: str | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """``{group value: {"day": sums, "month": sums}}`` for today and this UTC month
    (a group with no request this month is absent: the page shows zero)."""
    today = datetime.now(UTC).date()
    field = {"user": "user", "key": "key_id"}[group]
    summary = await api.get("/admin/v1/requests/summary", group_by=group, bucket="day",
                            team=team,
                            since=f"{today.replace(day=1).isoformat()}T00:00:00Z")
    if not summary.ok:
        raise ApiRefused(summary)  # an error page, never a zero that is not one
    out: dict[str, dict[str, dict[str, int]]] = {}
    for row in summary.body["data"]:
        name = row.get(field)
        if name is None:
            continue
        sums = out.setdefault(name, {"day": dict(ZERO), "month": dict(ZERO)})
        windows = ("month", "day") if row["period"] == today.isoformat() else ("month",)
        for window in windows:
            for k in SUMS:
                sums[window][k] += int(row[k])
    return out


def spent(figures: dict[str, dict[str, dict[str, int]]], name: str) -> dict[str, Any]:
    return figures.get(name, {"day": ZERO, "month": ZERO})
