"""``/admin/v1``: teams and keys over HTTP, for Terraform, a portal or a script.

Every profile serves it from the key store it already uses (the shared profile's
Postgres: any replica; a lease plane: its own SQLite keys). The routes call the key
store's own operations, the ones ``mayu keys``/``mayu teams`` call, so the CLI and the
API cannot disagree. Reads need a ``read`` or ``write`` admin token, writes a ``write``
one (the guards of :mod:`gateway.admin._access`, on each route's decorator); every write
is one audit line naming the token. A store that fails is the 503 of
:mod:`gateway.admin._errors`, a stale ``If-Match`` its 412.

Revisions: every team and key carries ``revision`` (also its ``ETag``); a write with
``If-Match`` is compared inside the store's write transaction, and a stale one is a 412
that changes nothing. Lists are ordered by id and paged with an opaque ``cursor``.
Errors are in OpenAI's shape, like every non-Anthropic route. ``docs/admin-api.md``.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, Router, get, patch, post, put
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, FromQuery, HeaderParameter, JSONBody, QueryParameter

from gateway.admin._access import (
    AdminCaller,
    Caller,
    Holder,
    in_own_teams,
    key_holder,
    read_access,
    write_access,
)
from gateway.admin._views import (
    ErrorBody,
    KeyCreate,
    KeyCreated,
    KeyPage,
    KeyPatch,
    KeyRotate,
    KeyRotated,
    KeyStatus,
    KeyView,
    TeamCreate,
    TeamPage,
    TeamPatch,
    TeamView,
    decode_cursor,
    found,
    key_view,
    page,
    team_view,
)
from gateway.errors import BadRequest
from gateway.guardrails import check_profiles
from gateway.ingress import ActingFor, Gateway, presented
from gateway.keys import KeyRecord, Rotation, TeamLimits, hash_key

AnyRequest = Request[Any, Any, Any]
log = logging.getLogger("mayu.admin")
PageSize = Annotated[int, QueryParameter(ge=1, le=500, description="page size (1-500)")]
Cursor = Annotated[str | None, QueryParameter(
    pattern=r"^(?:[0-9a-f]{2}){1,200}$",
    description="opaque: the next_cursor of the previous page")]
_ETAG = re.compile(r'(?:W/)?"?([0-9]{1,18})"?')


def error_responses(*statuses: int) -> dict[int, ResponseSpec]:
    """The documented error answers of a route (each in :class:`ErrorBody`'s shape)."""
    what = {400: "malformed input (param names it)", 401: "no admin token",
            403: "a read token asked to write", 404: "no such team or key",
            409: "already exists", 412: "If-Match is not the current revision",
            503: "the key store is unavailable"}
    return {s: ResponseSpec(ErrorBody, description=what[s], generate_examples=False)
            for s in (400, 401, 503, *statuses)}


READS, WRITES = error_responses(), error_responses(403, 404, 409, 412)


def _gateway(request: AnyRequest) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def if_match(request: AnyRequest) -> int | None:
    """The revision ``If-Match`` names (``"3"``, ``3`` or ``W/"3"``), None without one
    (or ``*``); anything else is a 400."""
    value = request.headers.get("if-match")
    if value is None or value.strip() == "*":
        return None
    found = _ETAG.fullmatch(value.strip())
    if found is None:
        raise BadRequest(
            'header If-Match: must be a revision as returned in ETag (e.g. "3")',
            param="If-Match")
    return int(found.group(1))


def _tagged(view: TeamView | KeyView, status: int = 200) -> Response[Any]:
    return Response(view, status_code=status, headers={"ETag": f'"{view.revision}"'})


def _audit(gw: Gateway, caller: AdminCaller, action: str, **fields: Any) -> None:
    gw.audit.write({"event": "admin", "action": action, "token": caller.name, **fields})


# -- teams ------------------------------------------------------------------------------

@get("/teams", summary="List teams",
      responses=READS, guards=[read_access])
async def list_teams(request: AnyRequest, caller: Caller, cursor: Cursor = None,
                     limit: PageSize = 100) -> TeamPage:
    """Every team (a team lead: their own)."""
    after = decode_cursor(cursor)
    teams = [t for t in await _gateway(request).key_store.list_teams()
             if in_own_teams(caller, t.name)]
    items, next_cursor = page([team_view(t) for t in teams], [t.id for t in teams],
                              after=after, limit=limit)
    return TeamPage(data=items, next_cursor=next_cursor)


@post("/teams", summary="Create a team", status_code=201,
      responses=WRITES, guards=[write_access])
async def create_team(request: AnyRequest, data: JSONBody[TeamCreate],
                     caller: Caller) -> Response[TeamView]:
    gw = _gateway(request)
    team = await gw.key_store.create_team(name=data.name, limits=data.limits,
                                          guardrails=tuple(data.guardrails))
    _audit(gw, caller, "team.create", team_id=team.id, team=team.name,
           revision=team.revision, limits=data.limits)
    return _tagged(team_view(team), 201)


@get("/teams/{team:str}", summary="Get a team (by name or id)",
      responses=error_responses(404), guards=[read_access])
async def get_team(request: AnyRequest, team: FromPath[str]) -> Response[TeamView]:
    got = await _gateway(request).key_store.get_team(team)
    return _tagged(team_view(found(got, f"team {team!r} does not exist")))


@put("/teams/{team:str}/limits", summary="Replace a team's limits",
      responses=WRITES, guards=[write_access])
async def put_team_limits(request: AnyRequest, team: FromPath[str],
                          data: JSONBody[TeamLimits], caller: Caller) -> Response[TeamView]:
    gw = _gateway(request)
    expected = if_match(request)
    updated = await gw.key_store.update_team(
        team, limits=data, expected_revision=expected)
    _audit(gw, caller, "team.limits", team_id=updated.id, team=updated.name,
           revision=updated.revision, if_match=expected, limits=data)
    return _tagged(team_view(updated))


@patch("/teams/{team:str}", summary="Edit a team (its guardrail profiles, its limits)",
       responses=WRITES, guards=[write_access])
async def patch_team(request: AnyRequest, team: FromPath[str], data: JSONBody[TeamPatch],
                     caller: Caller) -> Response[TeamView]:
    """Only the fields given change. The team's revision moves, so the next admission of
    every replica resolves its keys afresh; a request screened with the profiles it had
    is refused as a snapshot mismatch (retryable), never sent."""
    gw = _gateway(request)
    expected = if_match(request)
    guardrails = None if data.guardrails is msgspec.UNSET else tuple(data.guardrails)
    if guardrails is not None:
        check_profiles(gw.settings.guardrails, guardrails)
    before = await gw.key_store.get_team(team)
    updated = await gw.key_store.update_team(
        team, limits=None if data.limits is msgspec.UNSET else data.limits,
        guardrails=guardrails, expected_revision=expected)
    for key_hash, (_, principal) in list(gw.principals.items()):
        if principal.team_id == updated.id:  # this replica re-reads them at once
            gw.principals.pop(key_hash, None)
    changed = {f: getattr(data, f) for f in TeamPatch.__struct_fields__
               if getattr(data, f) is not msgspec.UNSET}
    if guardrails is not None:
        changed["guardrails_before"] = list(before.guardrails) if before else None
    _audit(gw, caller, "team.update", team_id=updated.id, team=updated.name,
           revision=updated.revision, if_match=expected, **changed)
    return _tagged(team_view(updated))


# -- keys -------------------------------------------------------------------------------

@get("/keys", summary="List keys (never their secrets)",
      responses=error_responses(404), guards=[read_access])
async def list_keys(request: AnyRequest, team: FromQuery[str | None] = None,
                    user: FromQuery[str | None] = None,
                    status: FromQuery[KeyStatus | None] = None,
                    cursor: Cursor = None,
                    limit: PageSize = 100) -> KeyPage:
    after = decode_cursor(cursor)
    keys: list[KeyRecord] = await _gateway(request).key_store.list_keys(
        team=team, include_revoked=True)
    now = datetime.now(UTC)
    views = [key_view(k, now) for k in keys]
    chosen = [v for v in views if (user is None or v.user == user)
              and (status is None or v.status == status)]
    items, next_cursor = page(chosen, [v.key_id for v in chosen], after=after, limit=limit)
    return KeyPage(data=await _with_last_use(request, items), next_cursor=next_cursor)


async def _with_last_use(request: AnyRequest, views: list[KeyView]) -> list[KeyView]:
    """The views with ``last_used_at`` from the request log (left out when the
    governance store cannot answer: the key store's answer still stands)."""
    gw = _gateway(request)
    try:
        used: dict[str, datetime] = await gw.governance.last_used(  # type: ignore[attr-defined]
            [v.key_id for v in views])
    except Exception:  # the governance store down: the keys are still worth listing
        log.warning("last_used_at: the governance store did not answer", exc_info=True)
        return views
    return [msgspec.structs.replace(v, last_used_at=used.get(v.key_id)) for v in views]


@post("/keys", summary="Create a key (its secret is in this answer only)", status_code=201,
      responses=WRITES, guards=[write_access])
async def create_key(request: AnyRequest, data: JSONBody[KeyCreate],
                         caller: Caller) -> Response[KeyCreated]:
    gw = _gateway(request)
    models = None if data.allowed_models is None else tuple(data.allowed_models)
    secret, record = await gw.key_store.create_key(
        team=data.team, name=data.name, user=data.user, allowed_models=models,
        limits=data.limits, expires_at=data.expires_at)
    view = key_view(record)
    _audit(gw, caller, "key.create", key_id=record.id, team_id=record.team_id,
           user=record.user, revision=record.revision, limits=data.limits)
    return Response(KeyCreated(key=view, secret=secret), status_code=201,
                    headers={"ETag": f'"{view.revision}"', "Cache-Control": "no-store"})


@get("/keys/{key_id:str}", summary="Get a key",
      responses=error_responses(404), guards=[read_access])
async def get_key(request: AnyRequest, key_id: FromPath[str]) -> Response[KeyView]:
    got = await _gateway(request).key_store.get_key(key_id)
    [view] = await _with_last_use(request, [key_view(found(got, f"key {key_id!r} does not "
                                                                "exist"))])
    return _tagged(view)


@patch("/keys/{key_id:str}", summary="Edit a key (name, user, models, limits, expiry)",
       responses=WRITES, guards=[write_access])
async def patch_key(request: AnyRequest, key_id: FromPath[str],
                    data: JSONBody[KeyPatch], caller: Caller) -> Response[KeyView]:
    """Only the fields given change; the key's id, team and secret never do. The next
    admission of every replica sees the new revision."""
    gw = _gateway(request)
    expected = if_match(request)
    record: KeyRecord = await gw.key_store.update_key(
        key_id, data.changes(), expected_revision=expected)
    _audit(gw, caller, "key.update", key_id=key_id, team_id=record.team_id,
           revision=record.revision, if_match=expected,
           changed=sorted(f for f in KeyPatch.__struct_fields__
                          if getattr(data, f) is not msgspec.UNSET))
    return _tagged(key_view(record))


@post("/keys/{key_id:str}/revoke", summary="Revoke a key (it stays listed)",
      status_code=200, responses=WRITES, guards=[write_access])
async def revoke_key(request: AnyRequest, key_id: FromPath[str],
                    caller: Caller) -> Response[KeyView]:
    gw = _gateway(request)
    expected = if_match(request)
    record: KeyRecord = await gw.key_store.revoke_key(
        key_id, expected_revision=expected)
    gw.principals.pop(record.key_hash, None)
    _audit(gw, caller, "key.revoke", key_id=record.id, team_id=record.team_id,
           revision=record.revision, if_match=expected)
    return _tagged(key_view(record))


IdempotencyKey = Annotated[str | None, HeaderParameter(
    name="Idempotency-Key", pattern=r"^[\x21-\x7e]{1,200}$", required=False,
    description="retrying with the same value answers the same new secret")]


@post("/keys/{key_id:str}/rotate", summary="Rotate a key: a new secret, the same key",
      status_code=200, responses=WRITES, guards=[write_access])
async def rotate_key(request: AnyRequest, key_id: FromPath[str], caller: Caller,
                     idempotency_key: IdempotencyKey = None,
                     data: JSONBody[KeyRotate | None] = None) -> Response[KeyRotated]:
    """The key keeps its id, limits, owner and spend; its revision goes up by one. The
    replaced secret authenticates it until ``previous_valid_until``. With an
    ``Idempotency-Key``, a retry (even a concurrent one, on any replica) answers the
    same new secret and rotates nothing more."""
    gw = _gateway(request)
    expected = if_match(request)
    grace = (data or KeyRotate()).grace_seconds
    done: Rotation = await gw.key_store.rotate_key(
        key_id, grace_s=grace, idempotency_key=idempotency_key,
        expected_revision=expected)
    if not done.replayed:
        _audit(gw, caller, "key.rotate", key_id=key_id, team_id=done.key.team_id,
               revision=done.key.revision, if_match=expected, grace_seconds=grace,
               previous_valid_until=done.previous_valid_until.isoformat())
    view = key_view(done.key)
    return Response(KeyRotated(key=view, secret=done.secret, replayed=done.replayed,
                               previous_valid_until=done.previous_valid_until),
                    headers={"ETag": f'"{view.revision}"', "Cache-Control": "no-store"})


# -- the key itself ---------------------------------------------------------------------

@post("/v1/me/revoke", summary="Revoke the presented key (whoever holds it)",
      status_code=200, responses=error_responses(), guards=[key_holder])
async def revoke_me(request: AnyRequest, holder: Holder) -> KeyView:
    """A leaked key can be killed by whoever has it: the key revokes itself."""
    gw = _gateway(request)
    record: KeyRecord = await gw.key_store.revoke_key(holder.key_id)
    who = presented(request)  # its cached principal goes with it
    gw.principals.pop(who.credential_sha256.hex() if isinstance(who, ActingFor)
                      else hash_key(who or ""), None)
    gw.audit.write({"event": "admin", "action": "key.revoke_self", "key_id": record.id,
                    "team_id": record.team_id, "revision": record.revision})
    return key_view(record)


ADMIN = Router(path="/admin/v1", route_handlers=[
    list_teams, create_team, get_team, put_team_limits, patch_team,
    list_keys, create_key, get_key, patch_key, revoke_key, rotate_key], tags=["admin"])
ROUTES: list[Router | HTTPRouteHandler] = [ADMIN, revoke_me]
