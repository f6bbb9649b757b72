"""A member's own page (a person signed in through an issuer with no other role): in each
of their teams the member budget that binds them (``GET
/admin/v1/teams/{team}/members/{user}``) beside this month's and today's spend
(``GET /admin/v1/requests/summary?team=&user=``), and their newest requests
(``GET /admin/v1/requests?user=``). The admin API lets a member read only routes naming
themselves, so this page cannot show anyone else's."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from litestar import Request, Response, get

from gateway.console._client import ApiRefused
from gateway.console._web import page, signed_in

AnyRequest = Request[Any, Any, Any]


@get("/mine")
async def mine(request: AnyRequest) -> Response[Any]:
    session, api = signed_in(request, admin=False, person=True)
    role = session.role
    if role is None:
        return page(request, "error.html", {"session": session, "message":
                                            "This page is a signed-in person's own."},
                    status=403)
    today = datetime.now(UTC).date()
    teams = []
    for team in role.teams:
        member = await api.get(f"/admin/v1/teams/{team}/members/{role.user}")
        summary = await api.get("/admin/v1/requests/summary", team=team, user=role.user,
                                group_by="user", bucket="day",
                                since=f"{today.replace(day=1).isoformat()}T00:00:00Z")
        if not summary.ok:
            raise ApiRefused(summary)
        rows = summary.body["data"]
        teams.append({"team": team, "member": member.body if member.ok else None,
                      "month": sum(r["usd_committed"] for r in rows),
                      "month_liability": sum(r["usd_liability"] for r in rows),
                      "today": sum(r["usd_committed"] for r in rows
                                   if r["period"] == today.isoformat())})
    requests = await api.get("/admin/v1/requests", user=role.user, limit="50")
    if not requests.ok:
        raise ApiRefused(requests)
    return page(request, "mine.html", {"session": session, "role": role, "teams": teams,
                                       "requests": requests.body["data"]})


ROUTES = [mine]
