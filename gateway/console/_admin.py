"""The operators' pages about teams: Overview (today and this month per team against its
limits) and Teams (one team's limits, editable with the revision check, and its keys).

Overview's figures are ``GET /admin/v1/requests/summary`` (per team and UTC day, since
the first of the month: the sums ``/v1/usage`` reports) against ``GET /admin/v1/teams``'
limits, and the budget alerts fired in today's and this month's windows
(``GET /admin/v1/alerts``); no figure is computed from anything the API does not answer.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from litestar import Request, Response, get, post
from litestar.params import FromPath
from litestar.response import Redirect

from gateway.console._client import Api, ApiRefused
from gateway.console._format import bar, window_resets
from gateway.console._forms import LABELS, MEMBER_LIMITS, TEAM_LIMITS, field_of, limits, text
from gateway.console._spend import spend_by, spent
from gateway.console._web import admin_page, page, signed_in, writer

AnyRequest = Request[Any, Any, Any]
_SUMS = ("requests", "tokens_committed", "usd_committed", "tokens_liability",
         "usd_liability", "tokens_reserved", "usd_reserved")


def _window(row: dict[str, int], limit: int | None, resets_at: str) -> dict[str, Any]:
    return {**row, "limit": limit, "resets_at": resets_at,
            "bar": bar(committed=row["usd_committed"], liability=row["usd_liability"],
                       reserved=row["usd_reserved"], limit=limit),
            "remaining": (None if limit is None else limit - row["usd_committed"]
                          - row["usd_liability"] - row["usd_reserved"])}


@get("/overview")
async def overview(request: AnyRequest) -> Response[Any]:
    session, api = signed_in(request, admin=True)
    today = datetime.now(UTC).date()
    day_resets, month_resets = window_resets(today)
    teams = await api.every("/admin/v1/teams")  # a team lead's own only
    rows: list[dict[str, Any]] = []
    # A team lead reads the summary one of their teams at a time (the API's own scope).
    for team in [None] if session.every_team else [t["name"] for t in teams]:
        summary = await api.get("/admin/v1/requests/summary", group_by="team", bucket="day",
                                since=f"{today.replace(day=1).isoformat()}T00:00:00Z",
                                team=team)
        if not summary.ok:
            raise ApiRefused(summary)  # an error page, never a zero that is not one
        rows += summary.body["data"]
    day: dict[str, dict[str, int]] = {}
    month: dict[str, dict[str, int]] = {}
    for row in rows:
        for into, wanted in ((month, True), (day, row["period"] == today.isoformat())):
            if wanted:
                sums = into.setdefault(row["team_id"], dict.fromkeys(_SUMS, 0))
                for k in _SUMS:
                    sums[k] += row[k]
    zero = dict.fromkeys(_SUMS, 0)
    cards = [{"team": t,
              "day": _window(day.get(t["id"], zero), t["limits"]["usd_micros_per_day"],
                             day_resets),
              "month": _window(month.get(t["id"], zero),
                               t["limits"]["usd_micros_per_month"], month_resets),
              "tokens_limit": t["limits"]["tokens_per_day"]}
             for t in teams]
    windows = (today.isoformat(), today.strftime("%Y-%m"))
    fired: dict[str, Any] = {"enabled": None, "data": []}  # a team lead: every team's
    if session.every_team:
        alerts = await api.get("/admin/v1/alerts",
                               since=f"{today.replace(day=1).isoformat()}T00:00:00Z")
        if not alerts.ok:
            raise ApiRefused(alerts)
        fired = alerts.body
    return page(request, "overview.html", {
        "session": session, "cards": cards, "today": today.isoformat(),
        "month": today.strftime("%Y-%m"), "alerts_on": fired["enabled"],
        "alerts": [a for a in fired["data"] if a["window"] in windows]})


async def _teams(request: AnyRequest, session: Any, api: Api, *,
                 errors: dict[str, str] | None = None, values: Any = None,
                 status: int = 200) -> Response[Any]:
    teams = await api.every("/admin/v1/teams")
    return page(request, "teams.html", {
        "session": session, "teams": teams, "fields": TEAM_LIMITS, "labels": LABELS,
        "errors": errors or {}, "values": values or {}}, status=status)


@post("/teams", status_code=303)
async def create_team(request: AnyRequest) -> Response[Any]:
    session, api, form = await writer(request)
    errors: dict[str, str] = {}
    name = text(form, "name")
    if not name:
        errors["name"] = "a team needs a name"
    body = {"name": name, "limits": limits(form, TEAM_LIMITS, errors)}
    if not errors:
        answer = await api.call("POST", "/admin/v1/teams", json=body)
        if answer.ok:
            return Redirect(f"/console/teams/{answer.body['id']}", status_code=303)
        errors[field_of(answer.error.get("param"), ("name", *TEAM_LIMITS))] = answer.message
    return await _teams(request, session, api, errors=errors, values=form, status=400)


@get("/teams/{team:str}")
async def team_page(request: AnyRequest, team: FromPath[str]) -> Response[Any]:
    session, api = signed_in(request, admin=True)
    return await _team(request, session, api, team)


async def _team(request: AnyRequest, session: Any, api: Api, team: str, *,
                errors: dict[str, str] | None = None, values: Any = None,
                member_form: str | None = None, status: int = 200) -> Response[Any]:
    """The team's page. ``member_form`` names the member form (a user, ``*`` for the
    default, ``""`` for a new member) whose ``errors`` and ``values`` these are."""
    found = await api.get(f"/admin/v1/teams/{quote(team, safe='')}")
    if not found.ok:
        return page(request, "error.html", {"session": session, "message": found.message},
                    status=found.status)
    team_id = found.body["id"]
    keys = await api.every("/admin/v1/keys", team=team_id)
    members, listed = await api.every_with_first(f"/admin/v1/teams/{team_id}/members")
    # The list says whether there is a default member budget; only then is it read
    # (its revision guards the form), so a team without one costs no 404.
    default = None
    if listed.get("default") is not None:
        default = await api.get(f"/admin/v1/teams/{team_id}/default-member")
        if not default.ok and default.status != 404:  # 404: removed in between
            raise ApiRefused(default)
    spend = await spend_by(api, "user", team=team_id)
    for_team = member_form is None
    return page(request, "team.html", {
        "session": session, "team": found.body, "keys": keys, "fields": TEAM_LIMITS,
        "names": {team_id: found.body["name"]}, "rotation_id": secrets.token_hex(16),
        "labels": LABELS, "errors": (errors or {}) if for_team else {},
        "values": values if for_team and values is not None else found.body["limits"],
        "members": [{**m, "spend": spent(spend, m["user"])} for m in members],
        "default": default.body if default is not None and default.ok else None,
        "member_fields": MEMBER_LIMITS,
        "member_form": member_form, "member_errors": {} if for_team else (errors or {}),
        "member_values": {} if for_team else (values or {}),
        "spend_by_key": await spend_by(api, "key", team=team_id),
        "saved": request.query_params.get("saved")}, status=status)


@post("/teams/{team:str}/limits", status_code=303)
async def edit_limits(request: AnyRequest, team: FromPath[str]) -> Response[Any]:
    """``PUT /admin/v1/teams/{team}/limits`` with ``If-Match`` of the revision the form
    was drawn from: a change made meanwhile is a 412, shown, and nothing is written."""
    session, api, form = await writer(request)
    errors: dict[str, str] = {}
    body = limits(form, TEAM_LIMITS, errors)
    revision = text(form, "revision")
    if not errors:
        path = f"/admin/v1/teams/{quote(team, safe='')}/limits"
        answer = await api.call("PUT", path, json=body,
                                headers={"If-Match": f'"{revision}"'})
        if answer.ok:
            return Redirect(f"/console/teams/{answer.body['id']}?saved=1", status_code=303)
        if answer.status == 412:
            errors["_form"] = (f"{answer.message} — the form now shows the current "
                               "limits; nothing was changed.")
            return await _team(request, session, api, team, errors=errors, status=412)
        errors[field_of(answer.error.get("param"), TEAM_LIMITS)] = answer.message
    return await _team(request, session, api, team, errors=errors, values=form, status=400)


ROUTES = [overview, admin_page("/teams", _teams), create_team, team_page, edit_limits]
