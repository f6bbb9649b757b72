"""The request log for operators (``/admin/v1/requests``) and for a key holder (its own:
``/v1/me/requests``): the API's filters, newest first, a next-page link, CSV export. On
the shared database the log holds every lease plane's requests too, each naming its
plane (filter ``plane``).

The filters go to the API as they are and its 400 (``param`` names the filter) is shown
next to that field. A date alone (``2026-12-04``) is taken as that day's UTC midnight.
With htmx the filter form and the next-page link replace only the table. Each row
opens its request: figures, outcome, the settlement's detail and the counters it charged.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, urlencode

from litestar import Request, Response

from gateway.console._client import ApiRefused
from gateway.console._web import admin_and_own, page, signed_in
from gateway.ingress import CLIENTS

AnyRequest = Request[Any, Any, Any]
FILTERS = ("team", "key_id", "user", "model", "status", "tool", "plane", "since", "until")
STATUSES = ("pending", "complete", "tokens_known", "uncertain", "invalid", "cancelled")
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _chosen(request: AnyRequest, *, admin: bool) -> dict[str, str]:
    names = FILTERS if admin else tuple(f for f in FILTERS
                                        if f not in ("team", "key_id", "plane"))
    chosen = {f: str(request.query_params.get(f) or "").strip() for f in names}
    for f in ("since", "until"):
        if _DAY.match(chosen[f]):
            chosen[f] += "T00:00:00Z"
    return chosen


async def _log(request: AnyRequest, *, admin: bool) -> Response[Any]:
    session, api = signed_in(request, admin=admin)
    chosen = _chosen(request, admin=admin)
    path = "/admin/v1/requests" if admin else "/v1/me/requests"
    answer = await api.get(path, limit="50", cursor=request.query_params.get("cursor"),
                           **chosen)
    errors: dict[str, str] = {}
    if not answer.ok:
        param = str(answer.error.get("param") or "")
        errors[param if param in chosen or param == "cursor" else "_form"] = answer.message
    names: dict[str, str] = {}
    if admin:
        names = {t["id"]: t["name"] for t in await api.every("/admin/v1/teams")}
    query = urlencode({k: v for k, v in chosen.items() if v})
    base = "/console/requests" if admin else "/console/me/requests"
    fragment = request.headers.get("hx-request") == "true"
    return page(request, "_requests_table.html" if fragment else "requests.html", {
        "session": session, "rows": answer.body["data"] if answer.ok else [],
        "next_cursor": answer.body.get("next_cursor") if answer.ok else None,
        "chosen": chosen, "errors": errors, "statuses": STATUSES, "tools": CLIENTS,
        "admin": admin,
        "names": names, "base": base, "query": query}, status=200 if answer.ok else answer.status)


async def _csv(request: AnyRequest, *, admin: bool) -> Response[Any]:
    _, api = signed_in(request, admin=admin)
    path = "/admin/v1/requests.csv" if admin else "/v1/me/requests.csv"
    status, body = await api.text(path, **_chosen(request, admin=admin))
    if status != 200:
        return Response(f"the API answered {status}\n", status_code=status,
                        media_type="text/plain")
    return Response(body, media_type="text/csv", headers={
        "Content-Disposition": 'attachment; filename="requests.csv"'})


async def _detail(request: AnyRequest, *, admin: bool) -> Response[Any]:
    """One request: ``GET /admin/v1/requests/{id}`` (a key holder's own:
    ``/v1/me/requests/{id}``), its figures, outcome, detail and the counters it charged."""
    session, api = signed_in(request, admin=admin)
    permit_id = str(request.path_params["permit_id"])
    path = ("/admin/v1/requests/" if admin else "/v1/me/requests/") + quote(permit_id,
                                                                            safe="")
    answer = await api.get(path)
    if not answer.ok:
        raise ApiRefused(answer)
    names: dict[str, str] = {}
    if admin:
        names = {t["id"]: t["name"] for t in await api.every("/admin/v1/teams")}
    return page(request, "request.html", {
        "session": session, "detail": answer.body, "r": answer.body["request"],
        "admin": admin, "names": names,
        "back": "/console/requests" if admin else "/console/me/requests"})


ROUTES = [*admin_and_own("/requests", _log), *admin_and_own("/requests.csv", _csv),
          *admin_and_own("/requests/{permit_id:str}", _detail)]
