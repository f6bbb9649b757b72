"""What every console page shares: the session guard, the CSRF check, rendering.

Before any console handler runs, :func:`load_session` reads the request's session from
the key store (gateway/console/_session.py). A page handler asks :func:`signed_in` for
it (an anonymous or signed-out visitor is sent to the sign-in page, their stale cookie
deleted; a key holder asking for an admin page to their own page) and a write handler
asks :func:`writer`, which also checks the form's CSRF token and the tier. The API
refuses a read token's write on its own (403); the console never offers one. A page that
only reads is registered through :func:`admin_page` (an admin's, or a team lead's own
teams) or :func:`admin_and_own` (an admin's and a key holder's own, one drawing).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from litestar import Request, Response, get
from litestar.datastructures import FormMultiDict
from litestar.handlers import HTTPRouteHandler
from litestar.response import Redirect, Template

from gateway.console._client import Api
from gateway.console._session import (
    Session,
    cleared,
    csrf_ok,
    current,
    open_session,
    presented_cookie,
)
from gateway.errors import InferplaneError

log = logging.getLogger("mayu.console")

AnyRequest = Request[Any, Any, Any]
Draw = Callable[..., Awaitable[Response[Any]]]
"""A page drawn for an admin or for a key holder: ``draw(request, admin=...)``."""
Drawn = Callable[[AnyRequest, Session, Api], Awaitable[Response[Any]]]
"""An admin page drawn for the signed-in session with its API."""


class Detour(Exception):
    """Not for this visitor: answer ``response`` instead (a redirect or a refusal)."""

    def __init__(self, response: Response[Any]) -> None:
        super().__init__("detour")
        self.response = response


def detour(_: AnyRequest, exc: Exception) -> Response[Any]:
    assert isinstance(exc, Detour)
    return exc.response


async def load_session(request: AnyRequest) -> None:
    """Every console request's first step: its session, read once (a key store that
    cannot answer is a 503 page, never a 500)."""
    try:
        await open_session(request)
    except InferplaneError as exc:
        log.warning("console: the session could not be read: %s", exc)
        raise Detour(refusal(request, "The key store is unavailable: try again in a "
                             "moment.", status=503)) from exc


def signed_in(request: AnyRequest, *, admin: bool,
              person: bool = False) -> tuple[Session, Api]:
    """The session and its API: ``admin`` pages (else to the session's own home), a
    key's pages, or with ``person`` a signed-in person's own page."""
    session = current(request)
    if session is None:
        away = Redirect("/console/login", status_code=303)
        raise Detour(cleared(request, away) if presented_cookie(request) else away)
    if admin and not session.is_admin:
        raise Detour(Redirect(home_of(session), status_code=303))
    if not admin and not person and session.role is not None and not session.is_admin:
        raise Detour(Redirect("/console/mine", status_code=303))  # a member: no key
    return session, api_of(request, session)


async def writer(request: AnyRequest) -> tuple[Session, Api, FormMultiDict]:
    """The session of a write: signed in, the form's CSRF token right, a write token."""
    session = current(request)
    form = await request.form()
    if session is None or not csrf_ok(session, form.get("csrf")):
        raise Detour(refusal(request, "This form is not from your console session "
                             "(missing or wrong CSRF token): nothing was changed. "
                             "Reload the page and try again."))
    if not session.can_write:
        who = "role" if session.role is not None else "admin token"
        raise Detour(refusal(request, f"Your {who} is read-only: nothing was changed."))
    return session, api_of(request, session), form


def api_of(request: AnyRequest, session: Session) -> Api:
    """The API as the session's holder sees it."""
    return Api(request.app, acting=session.acting, role=session.role)


def home_of(session: Session) -> str:
    """Where a session starts: Overview (every team), Teams (a team lead's own), the
    member's own page, or a key's."""
    if session.is_admin:
        return "/console/overview" if session.every_team else "/console/teams"
    return "/console/mine" if session.role is not None else "/console/me"


def refusal(request: AnyRequest, message: str, status: int = 403) -> Response[Any]:
    return page(request, "error.html", {"message": message, "session": current(request)},
                status=status)


def page(request: AnyRequest, name: str, context: Mapping[str, Any], *,
         status: int = 200) -> Template:
    """``templates/<name>`` with the session's CSRF token and the current path."""
    session: Session | None = context.get("session")
    full = {"csrf": session.csrf if session is not None else "", "path": request.url.path,
            **context}
    return Template(template_name=name, context=full, status_code=status)


def admin_and_own(path: str, draw: Draw) -> list[HTTPRouteHandler]:
    """``GET path`` for an admin and ``GET /me`` + ``path`` for a key holder, one page
    drawn by ``draw`` for both (the holder's from the ``/v1/me`` routes: their own)."""
    return [get(prefix + path)(_drawn(draw, admin=admin))
            for prefix, admin in (("", True), ("/me", False))]


def _drawn(draw: Draw, *, admin: bool) -> Callable[[AnyRequest], Awaitable[Response[Any]]]:
    async def handler(request: AnyRequest) -> Response[Any]:
        return await draw(request, admin=admin)

    handler.__name__ = f"{draw.__name__.lstrip('_')}_{'admin' if admin else 'own'}"
    return handler


def admin_page(path: str, draw: Drawn, *, scoped: Drawn | None = None) -> HTTPRouteHandler:
    """``GET path`` for an admin session, drawn by ``draw``; by ``scoped`` instead, when
    given, for a session that reads only its own teams (a team lead)."""
    async def handler(request: AnyRequest) -> Response[Any]:
        session, api = signed_in(request, admin=True)
        if scoped is not None and not session.every_team:
            return await scoped(request, session, api)
        return await draw(request, session, api)

    handler.__name__ = f"{path.strip('/').replace('/', '_')}_page"
    return get(path)(handler)
