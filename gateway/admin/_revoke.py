"""``/admin/v1/users/{user}/revoke`` and ``…/reinstate``: a person's brokered credentials.

Revoking a user refuses their token exchanges at inferplaned and revokes the brokered
keys their gateway credentials stand for (:func:`gateway.identity.revoke_person`, the
same function as inferplaned's ``POST /v1alpha1/users/{name}/revoke``): every replica
refuses those credentials at its next request. Brokered credentials live in the shared
profile; elsewhere the routes answer 404. Write tier; one audit line each.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec
from litestar import Request, Router, post
from litestar.params import FromPath

from gateway.admin._access import Caller, write_access
from gateway.admin._routes import _audit as audit_write
from gateway.admin._routes import _gateway as admin_gateway
from gateway.admin._routes import error_responses
from gateway.db import connection
from gateway.errors import NotFound
from gateway.identity import reinstate_person, revoke_person

AnyRequest = Request[Any, Any, Any]


class RevokedUser(msgspec.Struct, frozen=True, kw_only=True):
    user: str
    revoked: bool
    revoked_at: datetime | None = None
    keys_revoked: int = 0
    """Brokered keys revoked now (one per team the person had credentials for)."""


def _pool(request: AnyRequest) -> Any:
    gw = admin_gateway(request)
    if gw.pool is None:
        raise NotFound("brokered credentials exist in the shared profile only "
                       "(docs/identity.md)")
    return gw.pool


@post("/users/{user:str}/revoke", summary="Revoke a person's brokered credentials",
      status_code=200, responses=error_responses(403, 404), guards=[write_access])
async def revoke_user(request: AnyRequest, user: FromPath[str],
                      caller: Caller) -> RevokedUser:
    """Their exchanges are refused and every credential already issued to them is
    refused by every replica at its next request."""
    async with connection(_pool(request), "key store") as conn:
        done = await revoke_person(conn, user)
    if done is None:
        raise NotFound(f"user {user!r} does not exist")
    audit_write(admin_gateway(request), caller, "user.revoke", user=user,
                keys_revoked=done.keys_revoked)
    return RevokedUser(user=user, revoked=True, revoked_at=done.revoked_at,
                       keys_revoked=done.keys_revoked)


@post("/users/{user:str}/reinstate", summary="Let a revoked person exchange tokens again",
      status_code=200, responses=error_responses(403, 404), guards=[write_access])
async def reinstate_user(request: AnyRequest, user: FromPath[str],
                         caller: Caller) -> RevokedUser:
    """Credentials issued before the revocation stay refused."""
    async with connection(_pool(request), "key store") as conn:
        if not await reinstate_person(conn, user):
            raise NotFound(f"user {user!r} does not exist")
    audit_write(admin_gateway(request), caller, "user.reinstate", user=user)
    return RevokedUser(user=user, revoked=False)


ROUTES = [Router(path="/admin/v1", tags=["admin"],
                 route_handlers=[revoke_user, reinstate_user])]
