"""What every console page shares: the session guard, the CSRF check, rendering.

A page handler asks :func:`signed_in` for the session (an anonymous visitor is sent to
the sign-in page; a key holder asking for an admin page to their own page) and a write
handler asks :func:`writer`, which also checks the form's CSRF token and the tier. The
API refuses a read token's write on its own (403); the console never offers one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from litestar import Request, Response
from litestar.datastructures import FormMultiDict
from litestar.response import Redirect, Template

from gateway.console._client import Api
from gateway.console._session import Session, csrf_ok, current

AnyRequest = Request[Any, Any, Any]


class Detour(Exception):
    """Not for this visitor: answer ``response`` instead (a redirect or a refusal)."""

    def __init__(self, response: Response[Any]) -> None:
        super().__init__("detour")
        self.response = response


def detour(_: AnyRequest, exc: Exception) -> Response[Any]:
    assert isinstance(exc, Detour)
    return exc.response


def signed_in(request: AnyRequest, *, admin: bool) -> tuple[Session, Api]:
    session = current(request)
    if session is None:
        raise Detour(Redirect("/console/login", status_code=303))
    if admin and not session.is_admin:
        raise Detour(Redirect("/console/me", status_code=303))
    return session, Api(request.app, session.credential)


async def writer(request: AnyRequest) -> tuple[Session, Api, FormMultiDict]:
    """The session of a write: signed in, the form's CSRF token right, a write token."""
    session = current(request)
    form = await request.form()
    if session is None or not csrf_ok(session, form.get("csrf")):
        raise Detour(refusal(request, "This form is not from your console session "
                             "(missing or wrong CSRF token): nothing was changed. "
                             "Reload the page and try again."))
    if not session.can_write:
        raise Detour(refusal(request, "Your admin token is read-only: nothing was changed."))
    return session, Api(request.app, session.credential), form


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
