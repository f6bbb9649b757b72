"""Sign-in, sign-out and the console's front door.

Signing in checks the credential against the API itself: an admin token must be able to
list teams (``GET /admin/v1/teams``), a key must answer ``GET /v1/me``; anything else is
refused with one message that does not say which of the two it almost was.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get, post
from litestar.response import Redirect, Template

from gateway.console._client import Api
from gateway.console._session import (
    LOGIN_COOKIE,
    cleared,
    csrf_ok,
    current,
    expired,
    kind_of,
    login_cookie,
    login_nonce,
    login_ok,
    session_cookie,
)
from gateway.console._web import page

AnyRequest = Request[Any, Any, Any]


@get("/")
async def home(request: AnyRequest) -> Redirect:
    session = current(request)
    where = ("/console/login" if session is None else
             "/console/overview" if session.is_admin else "/console/me")
    return Redirect(where, status_code=303)


def _login_form(request: AnyRequest, *, error: str | None = None,
                status: int = 200) -> Template:
    nonce = login_nonce()
    answer = page(request, "login.html", {"login_csrf": nonce, "error": error},
                  status=status)
    answer.set_cookie(login_cookie(request, nonce))
    return answer


@get("/login")
async def login_page(request: AnyRequest) -> Response[Any]:
    if current(request) is not None:
        return Redirect("/console/", status_code=303)
    return _login_form(request)


@post("/login", status_code=303)
async def login(request: AnyRequest) -> Response[Any]:
    form = await request.form()
    if not login_ok(request, form.get("login_csrf")):
        return _login_form(request, status=403, error=(
            "This sign-in form is not from this console (or it expired): try again."))
    credential = str(form.get("credential") or "").strip()
    if not credential:
        return _login_form(request, status=400, error="Enter an admin token or a key.")
    kind, _ = kind_of(request, credential)
    api = Api(request.app, credential)
    probe = (await api.get("/admin/v1/teams", limit="1") if kind != "key"
             else await api.get("/v1/me"))
    if not probe.ok:
        return _login_form(request, status=401, error=(
            "Not a valid admin token or key (or it is revoked or expired)."))
    answer = Redirect("/console/", status_code=303)
    answer.set_cookie(session_cookie(request, credential))
    answer.set_cookie(expired(request, LOGIN_COOKIE))
    return answer


@post("/logout", status_code=303)
async def logout(request: AnyRequest) -> Response[Any]:
    """Sign out: the cookies are deleted (a forged sign-out is refused like any write)."""
    session = current(request)
    form = await request.form()
    if session is not None and not csrf_ok(session, form.get("csrf")):
        return page(request, "error.html", {"message": "Sign-out refused: wrong CSRF "
                                            "token.", "session": session}, status=403)
    return cleared(request, Redirect("/console/login", status_code=303))


ROUTES = [home, login_page, login, logout]
