"""inferplaned as the broker of gateway credentials (ADR-031, docs/identity.md).

``POST /v1alpha1/token`` is an RFC 8693 token exchange: a person's OIDC token (an ID
token or a JWT access token of a configured ``identity.issuers`` entry) for a gateway
credential bound to the person and one of their teams, signed by
:class:`gateway.identity.CredentialIssuer`. The first exchange of a person binds a user
record to their issuer and subject (a renamed email stays the same person) and makes the
brokered key the credential stands for in that team: the person is then admitted as
any user is, under the team's default member budget until an admin sets their own.
``GET /v1alpha1/jwks.json`` publishes the signing keys (gateways verify locally).
Lease-profile planes learn the brokered keys of their teams, and the deny list, from
every heartbeat's answer (:func:`people_for`, ``SyncResponse.people``), so a credential
issued once works on every plane of its team and a revocation reaches each plane with
its next heartbeat.
``POST /v1alpha1/users/{name}/revoke`` (a writer token) refuses the user's exchanges and
revokes their brokered keys, so every credential already issued is refused by every
gateway on its next request; ``…/reinstate`` lets them exchange again.

The token endpoint answers in OAuth's error shape (``{"error", "error_description"}``,
RFC 6749 §5.2), which the agents' OAuth clients read. No token, credential or secret is
ever logged: a log line names the user, team and issuer.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.params import FromPath

import sql
from controlplane.auth import TokenAuth
from gateway.config import resolve_secret
from gateway.db import Pool, connection, fetch_all, wrap_exceptions
from gateway.errors import ConfigError, NotFound
from gateway.identity import (
    CredentialIssuer,
    Identity,
    IdentitySettings,
    InvalidToken,
    Refused,
    Revoked,
    Verifiers,
    brokered_key_hash,
    reinstate_person,
    revoke_person,
)
from gateway.lease import BrokeredKey, DeniedKey, People, SyncRequest

log = logging.getLogger("inferplaned.identity")

GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
SUBJECT_TYPES = ("urn:ietf:params:oauth:token-type:id_token",
                 "urn:ietf:params:oauth:token-type:access_token",
                 "urn:ietf:params:oauth:token-type:jwt")
ISSUED_TYPE = "urn:ietf:params:oauth:token-type:jwt"
_WHAT = "identity database"


class Broker:
    """The issuers inferplaned trusts and the credentials it signs."""

    def __init__(self, settings: IdentitySettings) -> None:
        creds = settings.credentials
        if creds is None:
            raise ConfigError("identity.credentials: required to broker credentials")
        if not settings.issuers:
            raise ConfigError("identity.issuers: at least one issuer to exchange tokens of")
        signing = []
        for n, ref in enumerate(creds.signing_keys_ref):
            key = f"identity.credentials.signing_keys_ref[{n}]"
            secret = resolve_secret(ref, key=key)
            if len(secret) < 32:
                raise ConfigError(f"{key}: a signing secret must be at least 32 characters")
            signing.append(secret)
        self.verifiers = Verifiers(settings.issuers)
        self.issuer = CredentialIssuer(creds, signing)


def _oauth_error(exc: Refused) -> Response[dict[str, str]]:
    headers = {"Cache-Control": "no-store"}
    if exc.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="inferplaned"'
    return Response({"error": exc.error, "error_description": exc.description},
                    status_code=exc.status, headers=headers)


def _broker(request: Request[Any, Any, Any]) -> Broker:
    broker: Broker | None = request.app.state.broker
    if broker is None:
        raise NotFound("identity is not configured (identity.credentials, identity.issuers)")
    return broker


def _team_of(identity: Identity, form: dict[str, str]) -> str:
    """The team the credential is for: ``team`` (or ``scope`` ``team:<name>``), one of
    the person's teams; their only team when they name none."""
    wanted = form.get("team")
    for word in form.get("scope", "").split():
        if word.startswith("team:") and wanted is None:
            wanted = word[5:]
    if wanted is not None:
        if wanted not in identity.teams:
            raise Refused(400, "invalid_target", f"team {wanted!r} is not one of yours")
        return wanted
    if len(identity.teams) == 1:
        return identity.teams[0]
    if not identity.teams:
        raise Refused(403, "access_denied", "your token names no team (groups claim)")
    raise Refused(400, "invalid_target",
                   f"you are in several teams ({', '.join(identity.teams)}): pick one "
                   "with team=<name>")


@post("/v1alpha1/token", status_code=200)
async def token_exchange(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """RFC 8693: a person's OIDC token in, a gateway credential for one team out."""
    broker = _broker(request)
    form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
    try:
        if form.get("grant_type") != GRANT:
            raise Refused(400, "unsupported_grant_type", f"grant_type must be {GRANT}")
        token = form.get("subject_token")
        if not token or form.get("subject_token_type") not in SUBJECT_TYPES:
            raise Refused(400, "invalid_request", "subject_token and a subject_token_type "
                           f"of {', '.join(SUBJECT_TYPES)} are required")
        try:
            identity = await broker.verifiers.verify(token)
        except InvalidToken as exc:
            raise Refused(401, "invalid_grant", f"subject_token: {exc.message}") from exc
        team = _team_of(identity, form)
        async with wrap_exceptions(_WHAT), request.app.state.pool.connection() as conn, \
                conn.transaction():
            key_hash = await brokered_key_hash(conn, identity, team)
    except Refused as exc:
        log.info("token exchange refused: %s (%s)", exc.error, exc.description)
        return _oauth_error(exc)
    credential, exp = broker.issuer.issue(user=identity.user, team=team, key_hash=key_hash)
    log.info("credential issued: user=%s team=%s issuer=%s", identity.user, team,
             identity.issuer)
    return Response({"access_token": credential, "issued_token_type": ISSUED_TYPE,
                     "token_type": "Bearer", "expires_in": int(broker.issuer.settings.lifetime_s),
                     "expires_at": exp, "user": identity.user, "team": team},
                    headers={"Cache-Control": "no-store"})


@get("/v1alpha1/jwks.json")
async def jwks(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """The public keys of the credentials (no token: gateways fetch them)."""
    return Response(_broker(request).issuer.jwks(),
                    headers={"Cache-Control": "public, max-age=60"})


async def _set_revoked(request: Request[Any, Any, Any], name: str, *,
                       revoke: bool) -> dict[str, Any]:
    auth: TokenAuth = request.app.state.auth
    author = auth.require(request.headers.get("authorization"), write=True).name
    _broker(request)
    async with wrap_exceptions(_WHAT), request.app.state.pool.connection() as conn:
        done = await revoke_person(conn, name) if revoke else \
            await reinstate_person(conn, name)
    if done is None or done is False:
        raise NotFound(f"user {name!r} does not exist")
    log.warning("user %s %s by %s", name, "revoked" if revoke else "reinstated", author)
    if not isinstance(done, Revoked):
        return {"user": name, "revoked": False}
    return {"user": name, "revoked": True, "revoked_at": done.revoked_at.isoformat(),
            "keys_revoked": done.keys_revoked}


@post("/v1alpha1/users/{name:str}/revoke", status_code=200)
async def revoke_user(request: Request[Any, Any, Any], name: FromPath[str]) -> dict[str, Any]:
    """Refuse the user's exchanges and every credential already issued to them."""
    return await _set_revoked(request, name, revoke=True)


@post("/v1alpha1/users/{name:str}/reinstate", status_code=200)
async def reinstate_user(request: Request[Any, Any, Any],
                         name: FromPath[str]) -> dict[str, Any]:
    """Let a revoked user exchange tokens again (their old credentials stay refused)."""
    return await _set_revoked(request, name, revoke=False)


MAX_PLANE_KEYS = 100_000
"""Keys (deny list first) one heartbeat answer carries at most."""

DENY_WINDOW_S = 3600 + 300
"""How far back the deny list reaches without identity configured (keys made at
inferplaned only): a plane that held a key revoked earlier still revokes it, as a key
missing from a complete answer."""


async def people_for(pool: Pool, broker: Broker | None, req: SyncRequest,
                     granted: tuple[str, ...] | None) -> People | None:
    """The keys inferplaned holds for the plane's teams (those its heartbeat names and its
    token may serve) and the deny list, or None when the plane already holds them
    (``req.people``). The keys are the brokered ones and the plain keys a plane enforces
    as they are (no per-key limit or expiry: the keys ``POST /v1alpha1/teams/{team}/keys``
    makes; sql/identity_queries.sql ``plane_keys``). The deny list reaches back one
    credential lifetime plus the leeway: a key revoked earlier can no longer be presented
    by an unexpired credential (and a plane that holds it revokes it anyway, as a key
    missing from a complete answer)."""
    teams = [t for t in req.teams if granted is None or t in granted]
    if not teams:
        return None if req.people == _EMPTY.fingerprint else _EMPTY
    window = DENY_WINDOW_S if broker is None else broker.issuer.settings.lifetime_s + 300
    since = datetime.now(UTC) - timedelta(seconds=window)
    async with connection(pool, _WHAT) as conn:
        rows = await fetch_all(conn, sql.identity_queries["plane_keys"], {
            "teams": teams, "revoked_since": since, "limit": MAX_PLANE_KEYS + 1})
    complete = len(rows) <= MAX_PLANE_KEYS
    if not complete:
        log.warning("a heartbeat of data plane %r carries the first %d keys of its teams "
                    "only", req.dataplane.id, MAX_PLANE_KEYS)
        rows = rows[:MAX_PLANE_KEYS]
    keys = [BrokeredKey(id=r["id"], team=r["team"], user=r["user_name"] or "",
                        key_hash=r["key_hash"], brokered=r["brokered"],
                        name=r["name"] if not r["brokered"] else "brokered credential")
            for r in rows if r["revoked_at"] is None]
    denied = [DeniedKey(id=r["id"], team=r["team"], user=r["user_name"] or "",
                        revoked_at=r["revoked_at"]) for r in rows
              if r["revoked_at"] is not None]
    people = _people(keys, denied, complete=complete)
    return None if people.fingerprint == req.people else people


def _people(keys: list[BrokeredKey], denied: list[DeniedKey], *, complete: bool) -> People:
    digest = hashlib.sha256(msgspec.json.encode([keys, denied, complete])).hexdigest()
    return People(fingerprint=digest, keys=keys, denied=denied, complete=complete)


_EMPTY = _people([], [], complete=True)


ROUTES = [token_exchange, jwks, revoke_user, reinstate_user]
"""The identity routes, registered by :func:`controlplane.app.create_app`."""
