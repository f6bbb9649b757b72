"""Keys made at inferplaned's admin surface (docs/inferplaned.md, issue 35).

``POST /v1alpha1/teams/{team}/keys`` (a writer token) makes a key of a team in the
shared Postgres key store (:meth:`gateway.keys.PostgresKeyStore.create_key`) and answers
its secret once; only its SHA-256 is kept. ``POST /v1alpha1/keys/{id}/revoke`` revokes
it. Lease-profile planes that serve the team learn the key (its hash), and its
revocation, from their next heartbeat's answer (:func:`controlplane.identity.people_for`,
``SyncResponse.people``), so one key works on every plane of its team and a revoked one
is refused on each within one heartbeat. A key made here has no per-key limit and no
expiry: the team's limits and member budgets of each plane bind it, and nothing a plane
cannot enforce rides the heartbeat. The secret is never logged: a log line names the
key's id, team and the token's name.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import msgspec
from litestar import Request, post
from litestar.params import FromPath

from controlplane.auth import TokenAuth
from controlplane.body import bounded_body
from gateway.errors import BadRequest
from gateway.keys import KeyRecord, PostgresKeyStore

log = logging.getLogger("inferplaned.keys")


class NewKey(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /v1alpha1/teams/{team}/keys`` (every field optional)."""

    name: Annotated[str, msgspec.Meta(max_length=200, pattern=r"^[^\x00-\x1f\x7f-\x9f]*$")] = ""
    """The key's label (what ``mayu keys create --name`` takes: printable, ≤ 200)."""
    user: str | None = None
    """The key's user (their member budget on each plane binds it)."""


def _writer(request: Request[Any, Any, Any]) -> str:
    auth: TokenAuth = request.app.state.auth
    return auth.require(request.headers.get("authorization"), write=True).name


def _key(record: KeyRecord, team: str) -> dict[str, Any]:
    return {"id": record.id, "team": team, "name": record.name, "user": record.user,
            "display_prefix": record.display_prefix,
            "created_at": None if record.created_at is None else record.created_at.isoformat(),
            "revoked_at": None if record.revoked_at is None else record.revoked_at.isoformat()}


@post("/v1alpha1/teams/{team:str}/keys", status_code=201)
async def create_key(request: Request[Any, Any, Any], team: FromPath[str]) -> dict[str, Any]:
    """Make a key of ``team``; its secret is in this answer only (``key``)."""
    author = _writer(request)
    body = await bounded_body(request, limit="max_body_bytes")
    try:
        new = msgspec.json.decode(body or b"{}", type=NewKey)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadRequest(f"body: {exc} (a key made here takes name and user only)") from exc
    plaintext, record = await PostgresKeyStore(request.app.state.pool).create_key(
        team=team, name=new.name, user=new.user)
    log.info("key %s of team %s made by %s", record.id, team, author)
    return {"key": plaintext, **_key(record, team)}


@post("/v1alpha1/keys/{key_id:str}/revoke", status_code=200)
async def revoke_key(request: Request[Any, Any, Any], key_id: FromPath[str]) -> dict[str, Any]:
    """Revoke a key of the shared key store; every lease plane refuses it from its next
    heartbeat on."""
    author = _writer(request)
    store = PostgresKeyStore(request.app.state.pool)
    record = await store.revoke_key(key_id)
    team = await store.get_team(record.team_id)
    log.warning("key %s revoked by %s", key_id, author)
    return _key(record, team.name if team is not None else record.team_id)


ROUTES = [create_key, revoke_key]
"""The key routes, registered by :func:`controlplane.app.create_app`."""
