"""Bearer-token authentication and the writer/reader/data-plane tiers of inferplaned.

Every configured token has a *name* (the config key), and that name is the author
recorded with each published generation, so ``/v1alpha1/changes`` says who changed what
(the gap ADR-039's follow-up names). Writers may publish and read; readers may only
read; data planes (lease-profile gateways) may only sync, so a node's token can neither
publish nor read the policy API (what a sync answer carries is in docs/inferplaned.md).
A data-plane token may be bound to the plane ids it reports for
(:attr:`Identity.planes`); :meth:`TokenAuth.require_plane` refuses any other id.

A presented token is compared with ``hmac.compare_digest`` against *every* configured
token, without stopping at a match, so the time taken does not reveal which token (or
how much of one) matched.

With no token configured at all the control plane runs unauthenticated: every caller is
the writer ``unauthenticated``, and :mod:`controlplane.cli` refuses to bind anything but
loopback in that mode (ADR-034 §6).
"""

from __future__ import annotations

import hmac
from typing import Literal

import msgspec

from controlplane.settings import may_report
from gateway.errors import Forbidden, Unauthenticated

Role = Literal["writer", "reader", "dataplane"]
UNAUTHENTICATED = "unauthenticated"


class Identity(msgspec.Struct, frozen=True):
    name: str
    role: Role
    planes: tuple[str, ...] | None = None
    """A data-plane token's plane ids and ``prefix*`` entries (None: any id)."""
    teams: tuple[str, ...] | None = None
    """The teams a data-plane token's planes may report for (None: any)."""


class NotAuthenticated(Unauthenticated):
    """Missing or unknown bearer token."""

    code = "unauthenticated"


class ReadOnlyToken(Forbidden):
    """This token may only read; publishing needs a writer token."""

    code = "forbidden"


class WrongTier(Forbidden):
    """This token's tier may not use this endpoint."""

    code = "forbidden"


class PlaneNotAllowed(Forbidden):
    """This data-plane token may not report for this plane id."""

    code = "forbidden"


class TokenAuth:
    """Maps an ``Authorization: Bearer`` header to an :class:`Identity`."""

    def __init__(self, writers: dict[str, str], readers: dict[str, str],
                 dataplanes: dict[str, str] | None = None, *,
                 planes: dict[str, tuple[str, ...]] | None = None,
                 teams: dict[str, tuple[str, ...]] | None = None) -> None:
        bound, granted = planes or {}, teams or {}
        self._tokens: list[tuple[bytes, Identity]] = [
            *((t.encode(), Identity(n, "writer")) for n, t in writers.items()),
            *((t.encode(), Identity(n, "reader")) for n, t in readers.items()),
            *((t.encode(), Identity(n, "dataplane", bound.get(n), granted.get(n)))
              for n, t in (dataplanes or {}).items())]
        self.dataplane_names = tuple(sorted(dataplanes or {}))
        """Every configured data-plane token's name (a plane bound to one of them may be
        synced by no other token)."""

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def identify(self, authorization: str | None) -> Identity:
        """The caller's identity; raises :class:`NotAuthenticated` if unknown."""
        if not self._tokens:
            return Identity(UNAUTHENTICATED, "writer")
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            raise NotAuthenticated("missing bearer token (Authorization: Bearer <token>)")
        given = presented.strip().encode()
        found: Identity | None = None
        for token, identity in self._tokens:
            # No early exit: every comparison runs whatever matched before.
            if hmac.compare_digest(given, token):
                found = identity
        if found is None:
            raise NotAuthenticated("unknown bearer token")
        return found

    def require(self, authorization: str | None, *, write: bool) -> Identity:
        """A writer (or, to read, a reader); a data plane token gets 403 here."""
        identity = self.identify(authorization)
        if identity.role == "dataplane":
            raise WrongTier(f"token {identity.name!r} is a data plane token: it may only "
                            "sync (POST /v1alpha1/sync)")
        if write and identity.role != "writer":
            raise ReadOnlyToken(f"token {identity.name!r} is a reader token and may not "
                                "publish policies")
        return identity

    def require_dataplane(self, authorization: str | None) -> Identity:
        """A data plane token (or the unauthenticated identity when none is configured)."""
        identity = self.identify(authorization)
        if identity.role != "dataplane" and identity.name != UNAUTHENTICATED:
            raise WrongTier(f"token {identity.name!r} is a {identity.role} token: syncing "
                            "needs a data plane token (auth.dataplane_tokens_ref)")
        return identity

    def require_plane(self, identity: Identity, plane_id: str) -> None:
        """Refuse (403) a heartbeat for a plane id outside the token's ``planes``."""
        if not may_report(identity.planes, plane_id):
            raise PlaneNotAllowed(f"token {identity.name!r} may not report for data plane "
                                  f"{plane_id!r} (auth.dataplane_tokens_ref."
                                  f"{identity.name}.planes)")
