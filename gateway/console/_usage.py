"""Usage: spend and tokens over time, stacked by model, client tool, user, key or team,
for every team or one, and two teams or two users side by side.

Every figure is ``GET /admin/v1/requests/summary`` (a key holder's own:
``/v1/me/requests/summary``) with the page's group, bucket and range: committed µUSD
stacked by the chosen group with liability apart on top, committed tokens likewise, and
the same rows in a table under the charts. The range defaults to the last 30 days by
day; a range of 7 days or less is drawn by the hour unless a bucket is chosen. Input the
console can check (a date, a group, a bucket) is checked before the API is asked; the
API's own 400 is shown next to the field it names.

Under the charts, what the agents reported about their own usage over OTLP
(``GET /admin/v1/agent-usage``, a key's own ``/v1/me/agent-usage``: Claude Code's and
Codex's exports to the gateway's receiver) per day and team and user, or key, beside
the gateway's committed figures; a row whose gap the API flags (``bypass_suspected``:
traffic that bypassed the gateway) is marked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from litestar import Request, Response

from gateway.console._chart import Chart, periods, stacked, too_many
from gateway.console._client import Api
from gateway.console._format import count, money
from gateway.console._web import admin_and_own, page, signed_in

AnyRequest = Request[Any, Any, Any]
ADMIN_GROUPS = ("model", "tool", "user", "key", "team")
OWN_GROUPS = ("model", "tool", "user")
BUCKETS = ("auto", "day", "hour")
COMPARE = ("", "team", "user")
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_FIELD = {"team": "team_id", "user": "user", "key": "key_id", "model": "model",
          "tool": "tool"}
_DEFAULT_DAYS = 30
_HOURLY_UP_TO = timedelta(days=7)
_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(9999, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Query:
    """What the page was asked for, checked."""

    team: str
    group: str
    bucket: str
    since: datetime
    until: datetime | None
    compare: str
    a: str
    b: str
    raw: dict[str, str]


def _moment(name: str, raw: str, errors: dict[str, str]) -> datetime | None:
    if not raw:
        return None
    text = raw + "T00:00:00Z" if _DAY.match(raw) else raw
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        errors[name] = "a date (2026-12-04) or an RFC 3339 time (2026-12-04T13:00:00Z)"
        return None
    if at.tzinfo is None:
        errors[name] = "an RFC 3339 time needs an offset (…Z or +00:00)"
        return None
    if not _EARLIEST <= at < _LATEST:  # far ones would overflow the range arithmetic
        errors[name] = f"a time from {_EARLIEST:%Y-%m-%d} to before {_LATEST:%Y-%m-%d}"
        return None
    return at.astimezone(UTC)


def parse(params: Any, *, admin: bool, now: datetime) -> tuple[Query, dict[str, str]]:
    """The page's query and a message per bad field (never an exception)."""
    raw = {f: str(params.get(f) or "").strip()
           for f in ("team", "group", "bucket", "since", "until", "compare", "a", "b")}
    errors: dict[str, str] = {}
    groups = ADMIN_GROUPS if admin else OWN_GROUPS
    group = raw["group"] or "model"
    if group not in groups:
        errors["group"] = f"one of {', '.join(groups)}"
    bucket = raw["bucket"] or "auto"
    if bucket not in BUCKETS:
        errors["bucket"] = "auto, day or hour"
    compare = raw["compare"] if admin else ""
    if compare not in COMPARE:
        errors["compare"] = "blank, team or user"
    elif compare and not (raw["a"] and raw["b"]):
        errors["a" if not raw["a"] else "b"] = f"compare needs two {compare}s"
    until = _moment("until", raw["until"], errors)
    start = _moment("since", raw["since"], errors)
    end = until or now
    since = start or (end - timedelta(days=_DEFAULT_DAYS - 1)).replace(
        hour=0, minute=0, second=0, microsecond=0)
    if "since" not in errors and "until" not in errors and since >= end:
        errors["since"] = "must be before until (or now)"
    if bucket == "auto":
        bucket = "hour" if end - since <= _HOURLY_UP_TO else "day"
    if not errors and too_many(len(periods(since, end, bucket))):
        errors["bucket"] = "too many periods to draw: choose day, or a shorter range"
    return Query(team=raw["team"] if admin else "", group=group, bucket=bucket,
                 since=since, until=until, compare=compare, a=raw["a"], b=raw["b"],
                 raw=raw), errors


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


async def _panel(api: Api, path: str, q: Query, *, title: str, team: str, user: str,
                 errors: dict[str, str], field: str) -> dict[str, Any] | None:
    answer = await api.get(path, group_by=q.group, bucket=q.bucket, team=team or None,
                           user=user or None, since=_stamp(q.since),
                           until=_stamp(q.until) if q.until else None)
    if not answer.ok:
        param = str(answer.error.get("param") or "")
        errors[param if param in ("since", "until") else field] = answer.message
        return None
    rows: list[dict[str, Any]] = answer.body["data"]
    return {"title": title, "rows": rows}


def _series(rows: list[dict[str, Any]], group: str) -> list[str]:
    """The series by committed µUSD, largest first (so the legend reads by weight)."""
    spend: dict[str, int] = {}
    for r in rows:
        name = r[_FIELD[group]] or ""
        spend[name] = spend.get(name, 0) + r["usd_committed"]
    return sorted(spend, key=lambda s: (-spend[s], s))


def _charts(panels: list[dict[str, Any]], q: Query, names: dict[str, str]) -> None:
    """Draw each panel's money and token charts on one scale per kind (compare mode
    puts two panels side by side: the same height means the same figure)."""
    slots = periods(q.since, q.until or datetime.now(UTC), q.bucket)

    def label(s: str) -> str:
        return names.get(s, s) if s else "(none)"
    drawn: dict[str, list[tuple[list[str], dict[tuple[str, str], int], dict[str, int]]]]
    drawn = {"usd": [], "tokens": []}
    for p in panels:
        series = _series(p["rows"], q.group)
        for kind in ("usd", "tokens"):
            values: dict[tuple[str, str], int] = {}
            owed: dict[str, int] = {}
            for r in p["rows"]:
                key = (r["period"], r[_FIELD[q.group]] or "")
                values[key] = values.get(key, 0) + r[f"{kind}_committed"]
                owed[r["period"]] = owed.get(r["period"], 0) + r[f"{kind}_liability"]
            drawn[kind].append((series, values, owed))
        p["totals"] = {k: sum(r[k] for r in p["rows"]) for k in (
            "requests", "usd_committed", "usd_liability", "usd_reserved",
            "tokens_committed", "tokens_liability")}
    for kind, show in (("usd", money), ("tokens", lambda v: count(v, "tokens"))):
        top = max([_tallest(slots, v, s, o) for s, v, o in drawn[kind]] + [1])
        for p, (series, values, owed) in zip(panels, drawn[kind], strict=True):
            chart: Chart = stacked(slots, values, series=series, label=label, show=show,
                                   top=top, liability=owed)
            p[f"{kind}_chart"] = chart


def _tallest(slots: list[str], values: dict[tuple[str, str], int], series: list[str],
             owed: dict[str, int]) -> int:
    return max([sum(values.get((p, s), 0) for s in series) + owed.get(p, 0)
                for p in slots] + [0])


async def _usage(request: AnyRequest, *, admin: bool) -> Response[Any]:
    session, api = signed_in(request, admin=admin)
    q, errors = parse(request.query_params, admin=admin, now=datetime.now(UTC))
    names: dict[str, str] = {}
    teams: list[dict[str, Any]] = []
    if admin:
        teams = await api.every("/admin/v1/teams")
        names = {t["id"]: t["name"] for t in teams}
    path = "/admin/v1/requests/summary" if admin else "/v1/me/requests/summary"
    panels: list[dict[str, Any]] = []
    if not errors:
        asked = ([(q.a, q.a if q.compare == "team" else q.team,
                   q.a if q.compare == "user" else "", "a"),
                  (q.b, q.b if q.compare == "team" else q.team,
                   q.b if q.compare == "user" else "", "b")]
                 if q.compare else [("", q.team, "", "team")])
        for title, team, user, field in asked:
            found = await _panel(api, path, q, title=title, team=team, user=user,
                                 errors=errors, field=field)
            if found is not None:
                panels.append(found)
        if errors:
            panels = []
        else:
            _charts(panels, q, names)
    reported = await _reported(api, q, admin=admin) if panels and not q.compare else []
    return page(request, "usage.html", {
        "session": session, "q": q, "errors": errors, "panels": panels, "admin": admin,
        "teams": teams, "names": names, "groups": ADMIN_GROUPS if admin else OWN_GROUPS,
        "buckets": BUCKETS, "field": _FIELD.get(q.group, "model"),
        "base": "/console/usage" if admin else "/console/me/usage",
        "source": path, "reported": reported}, status=400 if errors else 200)


async def _reported(api: Api, q: Query, *, admin: bool) -> list[dict[str, Any]]:
    """The days on which the agents reported usage, each beside the gateway's figures
    (an API refusal shows no table: the charts above stand on their own)."""
    answer = await api.get("/admin/v1/agent-usage" if admin else "/v1/me/agent-usage",
                           group_by="team,user" if admin else "key", bucket="day",
                           team=q.team or None, since=_stamp(q.since),
                           until=_stamp(q.until) if q.until else None)
    if not answer.ok:
        return []
    return [r for r in answer.body["data"] if r["reported"]["reports"]]


ROUTES = admin_and_own("/usage", _usage)
