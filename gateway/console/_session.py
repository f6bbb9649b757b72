"""Console sign-in: who holds the session, and the CSRF token of each form.

A session is the presented credential — an admin token (``read`` or ``write``) or a
virtual key — in a cookie that scripts cannot read (HttpOnly), that no other site's
page sends (SameSite=Strict), Secure when the console is served over https, scoped to
``/console``. Nothing is kept on the server, so any worker or replica answers a session.
Beside the credential the cookie holds a random nonce made at sign-in; every form
carries ``HMAC-SHA256(credential, nonce)`` and a write whose form lacks it is refused:
a page of another origin knows neither. The sign-in form itself is guarded the same
way by a random value in a cookie of its own (double submit).

Another sign-in method (OIDC) plugs in by producing a :class:`Session` with another
``kind``; the pages only ask ``can_write`` and ``is_admin``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any, Literal

from litestar import Request, Response
from litestar.datastructures import Cookie

from gateway.admin import AdminAccess

SESSION_COOKIE = "inferplane_console"
LOGIN_COOKIE = "inferplane_console_login"
PATH = "/console"
Kind = Literal["write", "read", "key"]
AnyRequest = Request[Any, Any, Any]


@dataclass(frozen=True)
class Session:
    """The signed-in holder: their credential, what it is, and the session's nonce."""

    credential: str
    kind: Kind
    nonce: str
    name: str

    @property
    def is_admin(self) -> bool:
        return self.kind != "key"

    @property
    def can_write(self) -> bool:
        return self.kind == "write"

    @property
    def csrf(self) -> str:
        return csrf_token(self.credential, self.nonce)


def csrf_token(credential: str, nonce: str) -> str:
    return hmac.new(credential.encode(), f"console-csrf:{nonce}".encode(),
                    hashlib.sha256).hexdigest()


def kind_of(request: AnyRequest, credential: str) -> tuple[Kind, str]:
    """An admin token's tier and name (the tokens the admin API checks), else a key."""
    admin: AdminAccess = request.app.state.admin
    caller = admin.caller(credential)
    if caller is None:
        return "key", "key"
    return caller.access, caller.name


def current(request: AnyRequest) -> Session | None:
    """The session of this request's cookie, or None (no cookie, or a malformed one)."""
    raw = request.cookies.get(SESSION_COOKIE)
    if not raw or "." not in raw:
        return None
    nonce, packed = raw.split(".", 1)
    try:
        credential = base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4)).decode()
    except ValueError:
        return None
    if not credential or len(nonce) != 32:
        return None
    kind, name = kind_of(request, credential)
    return Session(credential=credential, kind=kind, nonce=nonce, name=name)


def csrf_ok(session: Session, presented: str | None) -> bool:
    return bool(presented) and hmac.compare_digest(session.csrf, presented or "")


def _cookie(request: AnyRequest, key: str, value: str, *, max_age: int | None) -> Cookie:
    return Cookie(key=key, value=value, path=PATH, httponly=True, samesite="strict",
                  secure=request.url.scheme == "https", max_age=max_age)


def session_cookie(request: AnyRequest, credential: str) -> Cookie:
    """A new session for ``credential`` (a new nonce: a new CSRF token)."""
    # Unpadded: "=" would make the cookie a quoted string.
    packed = base64.urlsafe_b64encode(credential.encode()).decode().rstrip("=")
    return _cookie(request, SESSION_COOKIE, f"{secrets.token_hex(16)}.{packed}",
                   max_age=None)


def login_nonce() -> str:
    return secrets.token_hex(16)


def login_cookie(request: AnyRequest, nonce: str) -> Cookie:
    return _cookie(request, LOGIN_COOKIE, nonce, max_age=1800)


def login_ok(request: AnyRequest, presented: str | None) -> bool:
    expected = request.cookies.get(LOGIN_COOKIE)
    return bool(expected and presented) and hmac.compare_digest(expected or "",
                                                                 presented or "")


def expired(request: AnyRequest, key: str) -> Cookie:
    """A cookie that deletes ``key``."""
    return _cookie(request, key, "", max_age=0)


def cleared(request: AnyRequest, response: Response[Any]) -> Response[Any]:
    """``response`` with the session and sign-in cookies deleted."""
    for key in (SESSION_COOKIE, LOGIN_COOKIE):
        response.set_cookie(expired(request, key))
    return response
