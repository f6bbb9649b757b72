"""People signed in through an OIDC issuer: their tokens verified, their roles read.

The admin API accepts, besides its configured tokens, a bearer that is an ID or access
token of an issuer in ``identity.issuers`` (:mod:`gateway.identity` verifies it: the
issuer's keys, algorithms, ``iss``/``aud``/``exp``/``nbf``/``iat``); the issuer's
``roles`` say what it may do (:mod:`gateway.roles`). The console signs people in with
the same issuers and the same roles. One :class:`People` per app (made at the first
use from the settings, closed at its shutdown), with one JWKS cache per issuer. A
console session keeps the role it signed in with until it ends (sign-out, expiry): a
change of the issuer's ``roles`` applies at the next sign-in, and removing the issuer's
``roles.console`` ends its sessions, and so does revoking the person
(:func:`revoked`: their next console request, and every bearer of theirs is refused).
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar

from gateway.identity import Identity, IssuerSettings, Verifiers
from gateway.ingress import Gateway
from gateway.roles import ConsoleClient, Role, role_of

_STATE = "identity_people"


class People:
    """The issuers of ``identity.issuers``: verification and roles."""

    def __init__(self, issuers: list[IssuerSettings]) -> None:
        self.issuers = {s.issuer: s for s in issuers}
        self._verifiers = Verifiers(issuers)

    @property
    def configured(self) -> bool:
        return bool(self.issuers)

    async def identity(self, token: str) -> Identity:
        """The verified token's identity (:class:`gateway.identity.InvalidToken`: 401)."""
        return await self._verifiers.verify(token)

    def role(self, identity: Identity) -> Role:
        """The role the identity's issuer gives its groups."""
        issuer = self.issuers[identity.issuer]
        groups: Any = identity.claims.get(issuer.groups_claim) or []
        groups = [groups] if isinstance(groups, str) else groups
        return role_of(issuer.roles, issuer=identity.issuer, user=identity.user,
                       groups=[g for g in groups if isinstance(g, str)],
                       teams=identity.teams)

    async def role_of_token(self, token: str) -> Role:
        return self.role(await self.identity(token))

    def consoles(self) -> list[tuple[int, IssuerSettings, ConsoleClient]]:
        """Every issuer the console signs in with: (its index, its settings, the client)."""
        return [(i, s, s.roles.console) for i, s in enumerate(self.issuers.values())
                if s.roles is not None and s.roles.console is not None]

    def console(self, index: int) -> tuple[IssuerSettings, ConsoleClient] | None:
        found = [(s, c) for i, s, c in self.consoles() if i == index]
        return found[0] if found else None

    async def aclose(self) -> None:
        await self._verifiers.aclose()


async def revoked(gw: Gateway, user: str) -> bool:
    """Whether ``user`` is revoked (``POST /admin/v1/users/{user}/revoke``; people are
    revoked in the shared profile's database only)."""
    if gw.pool is None:
        return False
    import sql
    from gateway.db import connection, fetch_one

    async with connection(gw.pool, "key store") as conn:
        row = await fetch_one(conn, sql.identity_queries["user_revoked"], {"name": user})
    return row is not None


def people_of(app: Litestar) -> People:
    """This app's :class:`People` (made at the first use from the gateway's settings)."""
    found: People | None = app.state.get(_STATE)
    if found is None:
        gw: Gateway = app.state.gateway
        identity = gw.settings.identity
        found = People(list(identity.issuers) if identity is not None else [])
        app.state[_STATE] = found
        app.on_shutdown.append(found.aclose)  # its JWKS clients close with the app
    return found
