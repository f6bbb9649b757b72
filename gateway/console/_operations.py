"""Operations (admin tokens only): what crashes and invalid usage left behind, and how
this gateway stands, with the operator's two actions.

Figures: ``GET /admin/v1/status``, ``/admin/v1/permits?status=pending`` and
``?status=uncertain`` (with the liability each holds), ``/admin/v1/frozen``. Actions
(write token, CSRF-checked like every console form): resolve a permit
(``POST /admin/v1/permits/{id}/resolve``, the ``mayu permits resolve`` path) and
unfreeze a counter (``POST /admin/v1/frozen/unfreeze``). A refusal is shown on the page
next to the permit or counter it concerns.

A team lead sees the pending permits and the liability awaiting resolution of their
own teams (the request log, ``GET /admin/v1/requests?team=…&status=…``, one team at a
time), read-only; how the gateway stands and the frozen counters are every team's (an
admin's or a reader's).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from litestar import Request, Response, post
from litestar.params import FromPath
from litestar.response import Redirect

from gateway.console._client import Api, ApiRefused
from gateway.console._forms import NotAWholeNumber, text, whole_number
from gateway.console._web import admin_page, page, writer

AnyRequest = Request[Any, Any, Any]
AS = ("uncertain", "cancelled")


async def _read(api: Api, path: str, **params: str) -> Any:
    answer = await api.get(path, **params)
    if not answer.ok:
        raise ApiRefused(answer)
    return answer.body


async def _page(request: AnyRequest, session: Any, api: Api, *,
                errors: dict[str, str] | None = None, status: int = 200) -> Response[Any]:
    teams = {t["id"]: t["name"] for t in await api.every("/admin/v1/teams")}
    return page(request, "operations.html", {
        "session": session, "status": await _read(api, "/admin/v1/status"),
        "pending": (await _read(api, "/admin/v1/permits", status="pending"))["data"],
        "uncertain": (await _read(api, "/admin/v1/permits", status="uncertain"))["data"],
        "frozen": (await _read(api, "/admin/v1/frozen"))["data"], "names": teams,
        "errors": errors or {}, "done": request.query_params.get("done"), "as": AS},
        status=status)


async def _team_page(request: AnyRequest, session: Any, api: Api) -> Response[Any]:
    """A team lead's: their teams' pending permits and liability, newest first (the
    first hundred of each kind per team, as an admin's page)."""
    teams = {t["id"]: t["name"] for t in await api.every("/admin/v1/teams")}
    found: dict[str, list[Any]] = {"pending": [], "uncertain": []}
    for name in teams.values():
        for status, rows in found.items():
            rows += (await _read(api, "/admin/v1/requests", team=name, status=status))["data"]
    # Settled uncertain permits await an operator only while they hold a liability.
    uncertain = [p for p in found["uncertain"] if p["usd_liability"] or p["tokens_liability"]]
    return page(request, "operations.html", {
        "session": session, "status": None, "frozen": None, "names": teams,
        "pending": _newest(found["pending"]), "uncertain": _newest(uncertain),
        "errors": {}, "done": None, "as": AS})


def _newest(permits: list[Any]) -> list[Any]:
    return sorted(permits, key=lambda p: str(p["created_at"]), reverse=True)


@post("/operations/permits/{permit_id:str}/resolve", status_code=303)
async def resolve(request: AnyRequest, permit_id: FromPath[str]) -> Response[Any]:
    """As uncertain or cancelled, or at an exact µUSD figure (``usd_micros``, with
    ``tokens`` optional): the API's resolve, its refusal shown beside the permit."""
    session, api, form = await writer(request)
    body: dict[str, Any] = {"reason": text(form, "reason") or "console"}
    usd, tokens = text(form, "usd_micros"), text(form, "tokens")
    error, status = None, 400
    if usd:
        try:
            body["usd_micros"] = whole_number(usd)
            if tokens:
                body["tokens"] = whole_number(tokens)
        except NotAWholeNumber as exc:
            error = f"µUSD and tokens: each {exc}"
    else:
        body["as"] = text(form, "as") or "uncertain"
    if error is None:
        answer = await api.call("POST", f"/admin/v1/permits/{quote(permit_id, safe='')}"
                                "/resolve", json=body)
        if answer.ok:
            what = "already resolved so" if answer.body["replay"] else answer.body["status"]
            return Redirect(f"/console/operations?done={quote(permit_id)}+{quote(what)}",
                            status_code=303)
        error, status = answer.message, answer.status
    return await _page(request, session, api, errors={permit_id: error}, status=status)


@post("/operations/unfreeze", status_code=303)
async def unfreeze(request: AnyRequest) -> Response[Any]:
    session, api, form = await writer(request)
    counter = text(form, "counter")
    answer = await api.call("POST", "/admin/v1/frozen/unfreeze", json={"counter": counter})
    if answer.ok:
        return Redirect(f"/console/operations?done={quote(counter)}+unfrozen",
                        status_code=303)
    return await _page(request, session, api, errors={counter: answer.message},
                       status=answer.status)


ROUTES = [admin_page("/operations", _page, scoped=_team_page), resolve, unfreeze]
