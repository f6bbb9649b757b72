"""Users: every user with their budget across teams (``GET /admin/v1/users``); with a
write token, set a user's budget, email and display name, or add a user.

A write is ``PUT /admin/v1/users/{user}`` with ``If-Match`` of the revision the form was
drawn from (``"0"``: create only): a change made meanwhile is the API's 412, shown with
the current figures, and nothing is written. Every field is replaced, as in the API.
A write token (or an admin) may also revoke a person's brokered credentials
(``POST /admin/v1/users/{user}/revoke``).

A team lead sees the users of their own teams only, each with the member budget that
binds them there (``GET /admin/v1/teams/{team}/members`` per team: budgets across
teams are every team's business, an admin's or a reader's).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from litestar import Request, Response, post
from litestar.params import FromPath
from litestar.response import Redirect

from gateway.console._client import Api
from gateway.console._forms import LABELS, MEMBER_LIMITS, field_of, limits, text
from gateway.console._web import admin_page, page, writer

AnyRequest = Request[Any, Any, Any]
_FIELDS = ("user", "email", "display_name", *MEMBER_LIMITS)


async def _team_users(request: AnyRequest, session: Any, api: Api) -> Response[Any]:
    """A team lead's: the users of each of their teams and what binds them there."""
    groups = []
    for team in await api.every("/admin/v1/teams"):  # the lead's own only
        members, first = await api.every_with_first(
            f"/admin/v1/teams/{quote(team['name'], safe='')}/members")
        groups.append({"team": team, "members": members, "default": first.get("default")})
    return page(request, "users_team.html", {
        "session": session, "groups": groups, "fields": MEMBER_LIMITS, "labels": LABELS})


async def _users(request: AnyRequest, session: Any, api: Api, *, form_of: str | None = None,
                 errors: dict[str, str] | None = None, values: Any = None,
                 status: int = 200) -> Response[Any]:
    """``form_of`` names the form (a user, ``""`` for a new one) the errors are for."""
    users = [{**u, "drawn": {"email": u["email"], "display_name": u["display_name"],
                             **u["limits"]}}
             for u in await api.every("/admin/v1/users")]
    return page(request, "users.html", {
        "session": session, "users": users, "fields": MEMBER_LIMITS, "labels": LABELS,
        "form_of": form_of, "errors": errors or {}, "values": values or {},
        "saved": request.query_params.get("saved"),
        "revoked": request.query_params.get("revoked")}, status=status)


@post("/users", status_code=303)
async def put_user(request: AnyRequest) -> Response[Any]:
    session, api, form = await writer(request)
    user, which = text(form, "user"), text(form, "form")
    errors: dict[str, str] = {}
    body: dict[str, Any] = {"limits": {k: v for k, v in limits(form, MEMBER_LIMITS,
                                                                errors).items()
                                       if v is not None}}
    for name in ("email", "display_name"):
        if text(form, name):
            body[name] = text(form, name)
    if not user:
        errors["user"] = "a user needs a name (the user of their keys)"
    elif user == "*":
        errors["user"] = "'*' is not a user name (it names a team's default member budget)"
    if errors:
        return await _users(request, session, api, form_of=which, errors=errors,
                            values=form, status=400)
    answer = await api.call("PUT", f"/admin/v1/users/{quote(user, safe='')}", json=body,
                            headers={"If-Match": f'"{text(form, "revision") or "0"}"'})
    if answer.ok:
        return Redirect(f"/console/users?saved={quote(user, safe='')}", status_code=303)
    if answer.status == 412:
        return await _users(request, session, api, form_of=which, status=412, errors={
            "_form": f"{answer.message} — the page now shows the current budget; nothing "
                     "was changed."})
    return await _users(request, session, api, form_of=which, values=form,
                        errors={field_of(answer.error.get("param"), _FIELDS):
                                answer.message},
                        status=answer.status if answer.status < 500 else 502)


@post("/users/{user:str}/revoke", status_code=303)
async def revoke_user(request: AnyRequest, user: FromPath[str]) -> Response[Any]:
    """Revoke a person's brokered credentials (``POST /admin/v1/users/{user}/revoke``):
    every replica refuses them at its next request; the API's refusal (e.g. not the
    shared profile) is shown beside the user."""
    session, api, _ = await writer(request)
    answer = await api.call("POST", f"/admin/v1/users/{quote(user, safe='')}/revoke")
    if answer.ok:
        return Redirect(f"/console/users?revoked={quote(user, safe='')}", status_code=303)
    return await _users(request, session, api, form_of=user, errors={"_form": answer.message},
                        status=answer.status if answer.status < 500 else 502)


ROUTES = [admin_page("/users", _users, scoped=_team_users), put_user, revoke_user]
