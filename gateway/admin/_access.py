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

People signed in through an OIDC issuer (``identity.issuers``; :mod:`gateway.roles`)
pass the same guards with their role: an ``admin`` as a write token, a ``reader`` as a
read token, a ``team lead`` reads only routes that take a ``team`` naming one of their
teams (and the team list, which its handler narrows), a ``member`` only routes that take
a ``user`` naming themselves; both read one request of the log
(``…/requests/{permit_id}``) when it is of their team, or theirs (else a 404, as an
unknown one). Their bearer is the issuer's token, verified on every call, or a gateway
credential inferplaned brokered (``identity.broker``: a member of its team, as the key
it stands for); the console's in-process calls carry the session's role instead
(:data:`ACTING_AS`).
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

from gateway.admin._people import people_of, revoked
from gateway.config import ServerSettings, resolve_admin_tokens
from gateway.errors import AccessDenied, NotFound, Unauthenticated
from gateway.identity import looks_like_jwt, unverified_issuer
from gateway.ingress import ActingFor, Gateway, authenticate, presented
from gateway.keys import Principal
from gateway.operations import OperatorStore
from gateway.roles import Role

Access = Literal["read", "write"]


@dataclass(frozen=True)
class AdminCaller:
    """The holder of a presented admin token (its configured name and access), or a
    person signed in through an issuer (``oidc:<user>``, their role's access)."""

    name: str
    access: Access
    role: Role | None = None
    """The person's role (None: an admin token)."""


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


# -- the tiers, as guards ------------------------------------------------------------

Connection = ASGIConnection[Any, Any, Any, Any]


def _request(connection: Connection) -> Request[Any, Any, Any]:
    # An HTTP route's guards are handed its Request (an ASGIConnection).
    return cast("Request[Any, Any, Any]", connection)


ACTING_AS = "inferplane.acting_as"
"""The ASGI scope key of an in-process call made for the console session of a person
signed in through an issuer (their :class:`gateway.roles.Role`; only code in this
process sets scope keys)."""


def _role_caller(role: Role) -> AdminCaller:
    return AdminCaller(f"oidc:{role.user}", "write" if role.name == "admin" else "read",
                       role=role)


async def _caller_of(request: Request[Any, Any, Any]) -> AdminCaller:
    """Who the request is: a console session's person, a configured admin token, or a
    bearer token of a trusted issuer (its role); else 401."""
    grant = request.scope.get(ACTING_AS)
    if isinstance(grant, Role):
        return _role_caller(grant)
    admin: AdminAccess = request.app.state.admin
    who = presented(request)
    caller = admin.caller(who)
    if caller is not None:
        return caller
    if isinstance(who, str) and looks_like_jwt(who):
        gw: Gateway = request.app.state.gateway
        broker = gw.settings.identity.broker if gw.settings.identity is not None else None
        if broker is not None and unverified_issuer(who) == broker.issuer:
            return _role_caller(await _credential_role(request, broker.issuer))
        if people_of(request.app).configured:
            role = await people_of(request.app).role_of_token(who)
            if await revoked(gw, role.user):
                raise AccessDenied(f"user {role.user!r} is revoked")
            return _role_caller(role)
    raise Unauthenticated("the admin API needs an admin token or a token of a trusted "
                          "issuer (Authorization: Bearer ...; server.admin_tokens, "
                          "identity.issuers)")


async def _credential_role(request: Request[Any, Any, Any], issuer: str) -> Role:
    """A brokered gateway credential's holder: a member of the credential's team, as the
    key it stands for (verified, and refused once that key is revoked)."""
    gw: Gateway = request.app.state.gateway
    principal = await authenticate(gw, request)
    return Role(name="member", user=principal.user or f"key:{principal.key_id}",
                teams=(principal.team.name,), issuer=issuer)


async def _admin(connection: Connection, handler: BaseRouteHandler, access: Access) -> None:
    request = _request(connection)
    caller = await _caller_of(request)
    if access == "write" and caller.access != "write":
        raise AccessDenied(f"{caller.role.name if caller.role else 'admin token'} "
                           f"{caller.name!r} is read-only")
    if caller.role is not None and not caller.role.every_team:
        await _within_own(request, handler, caller.role)
    connection.state.admin_caller = caller


async def _within_own(request: Request[Any, Any, Any], handler: BaseRouteHandler,
                      role: Role) -> None:
    """A team lead reads a route only for one of their teams (the route's ``team``,
    which it must take), or the team list (narrowed by its handler); a member only for
    themselves (the route's ``user``) and, where it names one, one of their teams."""
    takes = handler.parsed_fn_signature.parameters
    named: dict[str, str] = {}
    for name in ("team", "user"):
        given = {*request.query_params.getall(name, []),
                 *([str(request.path_params[name])] if name in request.path_params else [])}
        if len(given) > 1:  # the guard and the handler must read the same one
            raise AccessDenied(f"{role.name.replace('_', ' ')} {role.user!r}: one {name} "
                               "per request")
        if given:
            named[name] = given.pop()
    team, user = named.get("team"), named.get("user")
    permit = request.path_params.get("permit_id")
    if permit is not None and not named and "permit_id" in takes:
        await _own_permit(request, role, str(permit))
        return
    if role.name == "team_lead":
        if request.url.path == "/admin/v1/teams":
            return
        if team is None or "team" not in takes:
            raise AccessDenied(f"team lead {role.user!r} reads only their own teams "
                               f"({', '.join(role.teams) or 'none'}): this route needs "
                               "team=<one of them>")
    elif user != role.user or "user" not in takes:
        raise AccessDenied(f"member {role.user!r} reads only their own budget and "
                           f"requests (user={role.user!r})")
    if team is not None and not await _own_team(request, role, team):
        raise AccessDenied(f"{role.name.replace('_', ' ')} {role.user!r} may not read "
                           f"team {team!r}")


async def _own_permit(request: Request[Any, Any, Any], role: Role, permit_id: str) -> None:
    """One request of the log: a team lead's if of their team, a member's if theirs;
    anyone else's is a 404, as an unknown one."""
    gw: Gateway = request.app.state.gateway
    store: OperatorStore = gw.governance  # type: ignore[assignment]  # both stores
    info = await store.permit_info(permit_id)
    own = info is not None and (
        info.user == role.user if role.name == "member"
        else await _own_team(request, role, info.team_id))
    if not own:
        raise NotFound(f"request {permit_id!r}: no such permit in the request log")


async def _own_team(request: Request[Any, Any, Any], role: Role, team: str) -> bool:
    """Whether ``team`` (a name or an id) is one of the role's teams (by name)."""
    gw: Gateway = request.app.state.gateway
    found = await gw.key_store.get_team(team)
    return found is not None and found.name in role.teams


def in_own_teams(caller: AdminCaller, name: str) -> bool:
    """Whether ``caller`` may see team ``name`` (every team, or one of its own)."""
    return caller.role is None or caller.role.every_team or name in caller.role.teams


async def read_access(connection: Connection, handler: BaseRouteHandler) -> None:
    """A read or a write admin token, or a person whose role reads (else 401); a team
    lead or a member within their own (else 403)."""
    await _admin(connection, handler, "read")


async def write_access(connection: Connection, handler: BaseRouteHandler) -> None:
    """A write admin token or an admin (401 without a credential, 403 for a read one)."""
    await _admin(connection, handler, "write")


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
        await read_access(connection, handler)


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
