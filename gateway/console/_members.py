"""A team's members on its page: set or remove a member's own budget, set or remove the
team's default member budget, add a member (a PUT on a user the team does not know yet).

Every write goes to ``/admin/v1/teams/{team}/members/{user}`` or ``…/default-member``
with ``If-Match`` of the revision the form was drawn from (``"0"`` creates only): a change
made meanwhile is the API's 412, shown with the current figures, and nothing is written.
A bad field is a message next to it; the page itself is drawn by :func:`_admin._team`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from litestar import Request, Response, post
from litestar.params import FromPath
from litestar.response import Redirect

from gateway.console._admin import _team
from gateway.console._client import Answer
from gateway.console._forms import MEMBER_LIMITS, field_of, limits, text
from gateway.console._web import writer

AnyRequest = Request[Any, Any, Any]
DEFAULT = "*"


async def _answered(request: AnyRequest, session: Any, api: Any, team: str, form: Any,
                    answer: Answer, *, which: str, saved: str) -> Response[Any]:
    """A write's answer: back to the team's page, or the form again with the message."""
    if answer.ok:
        team_id = answer.body.get("team_id", team)
        return Redirect(f"/console/teams/{quote(team_id, safe='')}?saved={saved}",
                        status_code=303)
    if answer.status == 412:
        return await _team(request, session, api, team, member_form=which, status=412,
                           errors={"_form": f"{answer.message} — the page now shows the "
                                            "current budgets; nothing was changed."})
    errors = {field_of(answer.error.get("param"), ("user", *MEMBER_LIMITS)): answer.message}
    return await _team(request, session, api, team, member_form=which, errors=errors,
                       values=form, status=answer.status if answer.status < 500 else 502)


def _record(team: str, user: str | None) -> str:
    """The API's record of ``user``'s own budget in ``team`` (None: the team's default)."""
    team_record = f"/admin/v1/teams/{quote(team, safe='')}"
    if user is None:
        return f"{team_record}/default-member"
    return f"{team_record}/members/{quote(user, safe='')}"


async def _write(request: AnyRequest, session: Any, api: Any, team: str, form: Any, *,
                 method: str, user: str | None, revision: str, which: str, saved: str,
                 body: dict[str, Any] | None = None) -> Response[Any]:
    """``method`` on the record, if it is still at ``revision``; then as :func:`_answered`."""
    answer = await api.call(
        method, _record(team, user),
        json=None if body is None else {k: v for k, v in body.items() if v is not None},
        headers={"If-Match": f'"{revision}"'})
    return await _answered(request, session, api, team, form, answer, which=which,
                           saved=saved)


@post("/teams/{team:str}/members", status_code=303)
async def put_member(request: AnyRequest, team: FromPath[str]) -> Response[Any]:
    """Set (revision ≥ 1) or create (revision 0, a new member too) a member's budget."""
    session, api, form = await writer(request)
    user, revision = text(form, "user"), text(form, "revision") or "0"
    which = text(form, "form") or ""  # "" for the add-a-member form
    errors: dict[str, str] = {}
    body = limits(form, MEMBER_LIMITS, errors)
    if not user:
        errors["user"] = "a member needs a user name (the user of their keys)"
    elif user == DEFAULT:
        errors["user"] = "'*' names the team's default member budget; set it below"
    if errors:
        return await _team(request, session, api, team, member_form=which, errors=errors,
                           values=form, status=400)
    return await _write(request, session, api, team, form, method="PUT", user=user,
                        revision=revision, which=which, saved="member", body=body)


@post("/teams/{team:str}/members/remove", status_code=303)
async def delete_member(request: AnyRequest, team: FromPath[str]) -> Response[Any]:
    """Remove a member's own budget (the default binds them again)."""
    session, api, form = await writer(request)
    user = text(form, "user")
    return await _write(request, session, api, team, form, method="DELETE", user=user,
                        revision=text(form, "revision"), which=user, saved="removed")


@post("/teams/{team:str}/default-member", status_code=303)
async def put_default(request: AnyRequest, team: FromPath[str]) -> Response[Any]:
    """Set (or create, revision 0) the team's default member budget."""
    session, api, form = await writer(request)
    errors: dict[str, str] = {}
    body = limits(form, MEMBER_LIMITS, errors)
    if errors:
        return await _team(request, session, api, team, member_form=DEFAULT,
                           errors=errors, values=form, status=400)
    return await _write(request, session, api, team, form, method="PUT", user=None,
                        revision=text(form, "revision") or "0", which=DEFAULT,
                        saved="default", body=body)


@post("/teams/{team:str}/default-member/remove", status_code=303)
async def delete_default(request: AnyRequest, team: FromPath[str]) -> Response[Any]:
    """Remove the team's default member budget (no member cap for users without one)."""
    session, api, form = await writer(request)
    return await _write(request, session, api, team, form, method="DELETE", user=None,
                        revision=text(form, "revision"), which=DEFAULT, saved="removed")


ROUTES = [put_member, delete_member, put_default, delete_default]
