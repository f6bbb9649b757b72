"""Who may use the admin API: named tokens, by reference, in two tiers, and key holders.

``server.admin_tokens`` lists them (``name``, ``token_ref``, ``access``: ``read`` or
``write``); the older ``server.admin_token_ref`` counts as a ``read`` token named
``admin``. Every reference is resolved at startup (a bad one fails naming its key). A
presented token is compared with every configured one in constant time, all of them
every time, so neither the answer nor its timing tells which token came close.

The tiers are Litestar guards, declared on each route's decorator and checked before
its parameters and body are read: :func:`read_access` (a read or write token),
:func:`write_access` (a write token), :func:`key_holder` (a valid virtual key, for the
routes of the key itself) and :func:`own_or_read` (a key on ``/v1/me/…``, a read token
on ``/admin/v1/…``). A guard leaves who passed in the request's state, where a handler
takes it as its ``caller`` or ``holder`` parameter (:data:`DEPENDENCIES`).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any, Literal, cast

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency, Provide
from litestar.handlers import BaseRouteHandler

from gateway.config import ServerSettings, resolve_admin_tokens
from gateway.errors import AccessDenied, Unauthenticated
from gateway.ingress import ActingFor, Gateway, authenticate, presented
from gateway.keys import Principal

Access = Literal["read", "write"]


@dataclass(frozen=True)
class AdminCaller:
    """The holder of a presented admin token: its configured name and access."""

    name: str
    access: Access


class AdminAccess:
    """The configured admin tokens, resolved."""

    def __init__(self, tokens: list[tuple[str, str, Access]]) -> None:
        self._tokens = [(name, secret.encode(), access) for name, secret, access in tokens]

    @classmethod
    def from_settings(cls, server: ServerSettings) -> AdminAccess:
        """Resolved and checked as ``config check`` checks them
        (:func:`gateway.config.resolve_admin_tokens`)."""
        return cls(resolve_admin_tokens(server))

    @property
    def configured(self) -> bool:
        return bool(self._tokens)

    def caller(self, presented: str | ActingFor | None) -> AdminCaller | None:
        """The token's holder, or None when ``presented`` is no configured token (an
        in-process :class:`ActingFor` names one by its SHA-256)."""
        if not presented:
            return None
        digest = isinstance(presented, ActingFor)
        given = (presented.credential_sha256 if isinstance(presented, ActingFor)
                 else presented.encode())
        found: AdminCaller | None = None
        for name, secret, access in self._tokens:  # no early exit: constant time
            if hmac.compare_digest(given, hashlib.sha256(secret).digest() if digest
                                   else secret):
                found = AdminCaller(name, access)
        return found

    def require(self, presented: str | ActingFor | None, access: Access) -> AdminCaller:
        """The caller, if its token allows ``access``: else 401 (no such token) or 403
        (a read token asked to write)."""
        caller = self.caller(presented)
        if caller is None:
            raise Unauthenticated("the admin API needs an admin token "
                                  "(Authorization: Bearer ...; server.admin_tokens)")
        if access == "write" and caller.access != "write":
            raise AccessDenied(f"admin token {caller.name!r} is read-only")
        return caller


# -- the tiers, as guards ------------------------------------------------------------

Connection = ASGIConnection[Any, Any, Any, Any]


def _request(connection: Connection) -> Request[Any, Any, Any]:
    # An HTTP route's guards are handed its Request (an ASGIConnection).
    return cast("Request[Any, Any, Any]", connection)


def _admin(connection: Connection, access: Access) -> None:
    admin: AdminAccess = connection.app.state.admin
    connection.state.admin_caller = admin.require(presented(_request(connection)), access)


def read_access(connection: Connection, _: BaseRouteHandler) -> None:
    """A read or a write admin token (else 401)."""
    _admin(connection, "read")


def write_access(connection: Connection, _: BaseRouteHandler) -> None:
    """A write admin token (401 without an admin token, 403 for a read one)."""
    _admin(connection, "write")


async def key_holder(connection: Connection, _: BaseRouteHandler) -> None:
    """A valid virtual key (401 for none, an unknown, revoked or expired one; 503 when
    the key store cannot answer)."""
    gw: Gateway = connection.app.state.gateway
    connection.state.key_holder = await authenticate(gw, _request(connection))


async def own_or_read(connection: Connection, handler: BaseRouteHandler) -> None:
    """On ``/v1/me/…`` the key's own (:func:`key_holder`), elsewhere :func:`read_access`."""
    if connection.url.path.startswith("/v1/me"):
        await key_holder(connection, handler)
    else:
        read_access(connection, handler)


def _caller(request: Request[Any, Any, Any]) -> AdminCaller:
    caller: AdminCaller = request.state.admin_caller
    return caller


def _holder(request: Request[Any, Any, Any]) -> Principal | None:
    holder: Principal | None = request.state.get("key_holder")
    return holder


DEPENDENCIES = {"caller": Provide(_caller, sync_to_thread=False),
                "holder": Provide(_holder, sync_to_thread=False)}
"""``caller``: the admin token a guard let in; ``holder``: the key (None: an admin
token's request on a route both may use)."""
Caller = NamedDependency[AdminCaller]
"""A handler's ``caller: Caller`` parameter: the admin token its guard let in."""
Holder = NamedDependency[Principal]
"""A handler's ``holder: Holder`` parameter: the key its guard let in."""
