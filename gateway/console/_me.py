"""A key holder's own page: what binds their key (``GET /v1/me``), with a bar for every
window and account that has a limit (a rate bucket has only its balance), and a link to
their own requests."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from gateway.console._format import bar
from gateway.console._web import page, signed_in

AnyRequest = Request[Any, Any, Any]


@get("/me")
async def me_page(request: AnyRequest) -> Response[Any]:
    session, api = signed_in(request, admin=False)
    answer = await api.get("/v1/me")
    if not answer.ok:
        return page(request, "error.html", {"session": session, "message": answer.message},
                    status=answer.status)
    rows = []
    for limit in answer.body["limits"]:
        drawn = (bar(committed=limit["committed"] or 0, liability=limit["liability"] or 0,
                     reserved=(limit["reserved"] or 0) + (limit["leased"] or 0),
                     limit=limit["limit"])
                 if limit["kind"] != "bucket" and limit["limit"] is not None
                 and limit["committed"] is not None else None)
        rows.append({**limit, "bar": drawn})
    return page(request, "me.html", {"session": session, "me": answer.body, "rows": rows})


ROUTES = [me_page]
