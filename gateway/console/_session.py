"""Console sessions: who holds one, its cookie, and the CSRF token of each form.

Signing in makes a server-side session (:mod:`gateway.keys._sessions`): a random id
(``secrets.token_urlsafe(32)``, 256 bits) goes into the cookie ``inferplane_console``,
and the key store keeps only its SHA-256 beside the subject (``admin:<token name>`` or
``key:<key id>``), the tier and the SHA-256 of the credential it was made with. The
credential itself never leaves the sign-in request: not in the cookie, not on a page,
not on the server. Because the rows are in the key store, any worker or replica of the
shared profile answers a session made on another, and a sign-out on one ends it on all.

Every console request reads its session once (:func:`open_session`): the row must be
live (not ended, before its absolute expiry, used within the idle expiry; reading it
moves its last use) and the credential behind it must still stand — an admin token
still configured with the same name and tier, a key not revoked, expired or rotated out
— else every session of that credential is ended and the visitor is signed out. The
console's calls to the API then act for that credential by its digest
(:class:`gateway.ingress._prepare.ActingFor`), checked by the API as a presented one.

The cookie is HttpOnly (scripts cannot read it), SameSite=Strict (no other site's page
sends it), scoped to ``/console``, kept by the browser no longer than the session's
absolute expiry, and Secure when the visitor's request was https
(``server.console.secure_cookie``, ``server.trusted_proxies``). Every form carries
``HMAC-SHA256(session id, "console-csrf")``: a page of another origin knows neither.
The sign-in form itself is guarded by a random value in a cookie of its own (double
submit).

A person signed in through an OIDC issuer (:mod:`gateway.console._sso`) gets a session
of the same kind whose subject is their role (``oidc:…``, :class:`gateway.roles.Role`),
named in the store by the SHA-256 of that subject; it stands while their issuer is still
configured for the console. The console's calls act for the role
(``gateway.admin.ACTING_AS``), which the admin API's guards check as they check a
person's bearer token. The pages ask ``can_write``, ``is_admin`` and ``role``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from typing import Any, Literal, cast

from litestar import Request, Response
from litestar.datastructures import Cookie

from gateway.admin import AdminAccess, people_of, revoked
from gateway.config import ConsoleSettings
from gateway.ingress import ActingFor, Gateway
from gateway.keys import ConsoleSession, ConsoleSessionStore, SessionAccess
from gateway.roles import Role

log = logging.getLogger("mayu.console")
SESSION_COOKIE = "inferplane_console"
LOGIN_COOKIE = "inferplane_console_login"
PATH = "/console"
_STATE = "console_session"
Kind = SessionAccess
AnyRequest = Request[Any, Any, Any]


@dataclass(frozen=True)
class Session:
    """The signed-in holder: who (``subject``), their tier, the forms' CSRF token, and
    what the console's API calls act for."""

    subject: str
    kind: Kind
    csrf: str
    acting: ActingFor
    role: Role | None = None
    """A person signed in through an issuer (None: an admin token or a key)."""

    @property
    def name(self) -> str:
        """The admin token's name, the key's id, or the person's user name."""
        return self.role.user if self.role is not None else self.subject.partition(":")[2]

    @property
    def every_team(self) -> bool:
        """Whether the session reads every team (an admin token, an admin, a reader)."""
        return self.is_admin and (self.role is None or self.role.every_team)

    @property
    def is_admin(self) -> bool:
        return self.kind != "key"

    @property
    def can_write(self) -> bool:
        return self.kind == "write"


def settings_of(request: AnyRequest) -> ConsoleSettings:
    gw: Gateway = request.app.state.gateway
    return gw.settings.server.console


def _store(request: AnyRequest) -> ConsoleSessionStore:
    gw: Gateway = request.app.state.gateway
    # Both key stores (SQLite and Postgres) answer the console-session calls.
    return cast(ConsoleSessionStore, gw.key_store)


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


def csrf_token(session_id: str) -> str:
    return hmac.new(session_id.encode(), b"console-csrf", hashlib.sha256).hexdigest()


def kind_of(request: AnyRequest, credential: str) -> tuple[Kind, str]:
    """An admin token's tier and name (the tokens the admin API checks), else a key."""
    admin: AdminAccess = request.app.state.admin
    caller = admin.caller(credential)
    if caller is None:
        return "key", "key"
    return caller.access, caller.name


async def _stands(request: AnyRequest, row: ConsoleSession) -> bool:
    """Whether the credential a session was made with still opens it: an admin token
    configured now with the session's name and tier, or a key that still resolves."""
    acting = ActingFor(row.credential_sha256)
    role = Role.parse(row.subject)
    if role is not None:
        return await _sso_stands(request, role)
    if row.access != "key":
        admin: AdminAccess = request.app.state.admin
        caller = admin.caller(acting)
        return (caller is not None and caller.access == row.access
                and row.subject == f"admin:{caller.name}")
    gw: Gateway = request.app.state.gateway
    principal = await gw.key_store.resolve(row.credential_sha256.hex())
    return principal is not None and row.subject == f"key:{principal.key_id}"


async def _sso_stands(request: AnyRequest, role: Role) -> bool:
    """A person's session stands while their issuer still signs in to the console and
    they are not revoked."""
    gw: Gateway = request.app.state.gateway
    return (any(s.issuer == role.issuer for _, s, _ in people_of(request.app).consoles())
            and not await revoked(gw, role.user))


async def open_session(request: AnyRequest) -> Session | None:
    """This request's live session (kept for :func:`current`), or None: no cookie, an
    unknown, ended or expired one, or one whose credential no longer stands (every
    session of that credential is ended then)."""
    request.state[_STATE] = None
    session_id = request.cookies.get(SESSION_COOKIE)
    if not session_id or len(session_id) > 128:
        return None
    store = _store(request)
    row = await store.console_session(_digest(session_id),
                                      idle_s=settings_of(request).session_idle_s)
    if row is None:
        return None
    if not await _stands(request, row):
        ended = await store.end_console_sessions(row.credential_sha256)
        log.info("console: %d session(s) of %s signed out: the credential no longer "
                 "stands (revoked, expired, rotated out, or gone from the config)",
                 ended, row.subject)
        return None
    session = Session(subject=row.subject, kind=row.access, csrf=csrf_token(session_id),
                      acting=ActingFor(row.credential_sha256), role=Role.parse(row.subject))
    request.state[_STATE] = session
    return session


def current(request: AnyRequest) -> Session | None:
    """The session :func:`open_session` found for this request (None before it ran)."""
    found: Session | None = request.state.get(_STATE)
    return found


def presented_cookie(request: AnyRequest) -> bool:
    return bool(request.cookies.get(SESSION_COOKIE))


async def start_session(request: AnyRequest, *, credential: str, subject: str,
                        kind: Kind) -> Cookie:
    """A new session for the holder of ``credential`` (kept by its digest only): the
    cookie that carries its id."""
    settings = settings_of(request)
    session_id = secrets.token_urlsafe(32)
    await _store(request).create_console_session(
        id_sha256=_digest(session_id), subject=subject, access=kind,
        credential_sha256=_digest(credential), max_age_s=settings.session_max_s)
    return _cookie(request, SESSION_COOKIE, session_id, max_age=int(settings.session_max_s))


async def end_session(request: AnyRequest) -> None:
    """End the session of this request's cookie (sign-out), live or not."""
    session_id = request.cookies.get(SESSION_COOKIE)
    if session_id and len(session_id) <= 128:
        await _store(request).end_console_session(_digest(session_id))


def csrf_ok(session: Session, presented: str | None) -> bool:
    return bool(presented) and hmac.compare_digest(session.csrf, presented or "")


def _cookie(request: AnyRequest, key: str, value: str, *, max_age: int | None,
            samesite: Literal["strict", "lax"] = "strict") -> Cookie:
    secure = (settings_of(request).secure_cookie == "always"
              or request.url.scheme == "https")
    return Cookie(key=key, value=value, path=PATH, httponly=True, samesite=samesite,
                  secure=secure, max_age=max_age)


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
