"""Sign-in, sign-out and the console's front door.

Signing in checks the credential against the API itself: an admin token must be able to
list teams (``GET /admin/v1/teams``), a key must answer ``GET /v1/me``; anything else is
refused with one message that does not say which of the two it almost was, and counts
against the client's address (:mod:`gateway.console._throttle`; past
``server.console.sign_in_failures`` a 429 with ``Retry-After``). A good credential gets
a new server-side session (gateway/console/_session.py); the credential goes no further
than this request. Sign-out ends the session in the key store, for every replica.

With single sign-on configured (gateway/console/_sso.py) the form offers it first; an
admin token's sign-in stays as the break-glass way in and is one audit line and one
WARNING saying so (its name, tier and the client's address, never the token).
"""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response, get, post
from litestar.response import Redirect, Template

from gateway.admin import people_of
from gateway.console._client import Api
from gateway.console._session import (
    LOGIN_COOKIE,
    cleared,
    csrf_ok,
    current,
    end_session,
    expired,
    kind_of,
    login_cookie,
    login_nonce,
    login_ok,
    settings_of,
    start_session,
)
from gateway.console._throttle import SignInThrottle
from gateway.console._web import home_of, page
from gateway.ingress import Gateway

AnyRequest = Request[Any, Any, Any]
log = logging.getLogger("mayu.console")
_THROTTLE = "console_sign_in_throttle"


@get("/")
async def home(request: AnyRequest) -> Redirect:
    session = current(request)
    return Redirect("/console/login" if session is None else home_of(session),
                    status_code=303)


def _login_form(request: AnyRequest, *, error: str | None = None,
                status: int = 200) -> Template:
    nonce = login_nonce()
    issuers = [(i, client.name) for i, _, client in people_of(request.app).consoles()]
    answer = page(request, "login.html", {"login_csrf": nonce, "error": error,
                                          "issuers": issuers}, status=status)
    answer.set_cookie(login_cookie(request, nonce))
    return answer


def _throttle(request: AnyRequest) -> SignInThrottle:
    """This app's count of failed sign-ins (made at the first sign-in)."""
    found: SignInThrottle | None = request.app.state.get(_THROTTLE)
    if found is None:
        settings = settings_of(request)
        found = SignInThrottle(failures=settings.sign_in_failures,
                               window_s=settings.sign_in_window_s)
        request.app.state[_THROTTLE] = found
    return found


def _address(request: AnyRequest) -> str:
    """The client's address (a trusted proxy's X-Forwarded-For already applied)."""
    return request.client.host if request.client is not None else "unknown"


@get("/login")
async def login_page(request: AnyRequest) -> Response[Any]:
    if current(request) is not None:
        return Redirect("/console/", status_code=303)
    return _login_form(request)


@post("/login", status_code=303)
async def login(request: AnyRequest) -> Response[Any]:
    address = _address(request)
    wait = _throttle(request).retry_after(address)
    if wait is not None:
        log.warning("console sign-in from %s refused: too many failed sign-ins (retry "
                    "after %d s)", address, wait)
        answer = _login_form(request, status=429, error=(
            f"Too many failed sign-ins from your address: try again in {wait} seconds."))
        answer.headers["Retry-After"] = str(wait)
        return answer
    form = await request.form()
    if not login_ok(request, form.get("login_csrf")):
        return _login_form(request, status=403, error=(
            "This sign-in form is not from this console (or it expired): try again."))
    credential = str(form.get("credential") or "").strip()
    if not credential:
        return _login_form(request, status=400, error="Enter an admin token or a key.")
    kind, name = kind_of(request, credential)
    api = Api(request.app, credential=credential)
    probe = (await api.get("/admin/v1/teams", limit="1") if kind != "key"
             else await api.get("/v1/me"))
    if not probe.ok:
        failures = _throttle(request).failed(address)
        log.warning("console sign-in from %s refused: not a valid admin token or key "
                    "(%d failed within %g s)", address, failures,
                    settings_of(request).sign_in_window_s)
        return _login_form(request, status=401, error=(
            "Not a valid admin token or key (or it is revoked or expired)."))
    subject = f"admin:{name}" if kind != "key" else f"key:{probe.body['key']['id']}"
    if kind != "key":  # an admin token: the break-glass way in, beside single sign-on
        gw: Gateway = request.app.state.gateway
        gw.audit.write({"event": "console_sign_in", "method": "break-glass sign-in",
                        "subject": subject, "access": kind, "address": address})
        log.warning("console: break-glass sign-in with admin token %r (%s) from %s",
                    name, kind, address)
    signed = Redirect("/console/", status_code=303)
    signed.set_cookie(await start_session(request, credential=credential, subject=subject,
                                          kind=kind))
    signed.set_cookie(expired(request, LOGIN_COOKIE))
    return signed


@post("/logout", status_code=303)
async def logout(request: AnyRequest) -> Response[Any]:
    """Sign out: the session ends in the key store and its cookie is deleted (a forged
    sign-out is refused like any write)."""
    session = current(request)
    form = await request.form()
    if session is not None and not csrf_ok(session, form.get("csrf")):
        return page(request, "error.html", {"message": "Sign-out refused: wrong CSRF "
                                            "token.", "session": session}, status=403)
    await end_session(request)
    return cleared(request, Redirect("/console/login", status_code=303))


ROUTES = [home, login_page, login, logout]
