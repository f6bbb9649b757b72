"""Cloud credentials brokered to lease planes (ADR-031: none rests in the data plane).

``POST /v1alpha1/credentials`` with a data-plane token and a body ``{"credential":
NAME, "team": TEAM, "dataplane_id": ID}`` answers one short-lived STS session::

    {"credential", "team", "session_name", "access_key_id", "secret_access_key",
     "session_token", "expiration"}

inferplaned assumes the role of the configured credential (``credentials.NAME.aws``,
:class:`controlplane.settings.BrokeredCredential`) with its own source credentials,
once per request: the session is named ``<session_name>-<team>@<plane>`` (what
CloudTrail shows as the caller) and tagged ``team`` and ``dataplane`` on top of the
configured ``session_tags``. The plane keeps the answer in memory and asks again before
it expires (``gateway.providers._credentials.fetch_brokered``).

Who gets what: only a data-plane token bound to teams (``auth.dataplane_tokens_ref.N.
teams``) gets a credential, and only for one of those teams (and one the credential's
own ``teams`` allows); a ``dataplane_id`` must be one of the token's ``planes``. Every
refusal is a 403 in inferplaned's error shape, logged as a warning naming the token, the
plane, the credential and the team; every issue is logged at info with the session name
and expiry. No log line, error or metric ever carries a key id, secret or session token.
The answer is ``Cache-Control: no-store``; between plane and daemon the channel must be
TLS anywhere but loopback (docs/bedrock.md, "Lease profile").
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, post

from controlplane.auth import Identity, TokenAuth
from controlplane.body import decode_body
from controlplane.settings import BrokeredCredential
from gateway.config import resolve_secret
from gateway.errors import BadRequest, ConfigError, Forbidden, NotFound, UpstreamUnavailable
from gateway.providers import CredentialAnswer, fetch_aws

log = logging.getLogger("inferplaned.credentials")

MAX_BODY_BYTES = 4096
_NAME = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
_UNSAFE = re.compile(r"[^\w+=,.@-]")
"""Characters STS refuses in a role session name."""


class CredentialRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    credential: _NAME
    team: _NAME
    dataplane_id: _NAME | None = None


class NotGranted(Forbidden):
    """This data-plane token may not have this credential for this team."""

    code = "forbidden"


class IssueFailed(UpstreamUnavailable):
    """The STS did not issue a session (its error names why; never a secret)."""

    code = "credential_issue_failed"


class CredentialBroker:
    """The configured credentials, checked at start (every reference resolved)."""

    def __init__(self, credentials: dict[str, BrokeredCredential]) -> None:
        for name, entry in credentials.items():
            key = f"credentials.{name}.aws"
            aws = entry.aws
            if aws.role_arn is None:
                raise ConfigError(f"{key}.role_arn: required (inferplaned hands out STS "
                                  "sessions of a role, never its own credentials)")
            if aws.broker is not None:
                raise ConfigError(f"{key}.broker: inferplaned is the broker; give it the "
                                  "role's source credentials instead")
            for field in ("access_key_id_ref", "secret_access_key_ref", "session_token_ref"):
                ref = getattr(aws, field)
                if ref is not None:
                    resolve_secret(ref, key=f"{key}.{field}")
        self.credentials = credentials

    def check(self, identity: Identity, req: CredentialRequest) -> BrokeredCredential:
        """The credential ``req`` names, if ``identity`` may have it for its team."""
        entry = self.credentials.get(req.credential)
        if entry is None:
            raise NotFound(f"credential {req.credential!r} is not configured "
                           "(inferplaned credentials section)")
        if identity.teams is None:
            raise NotGranted(f"token {identity.name!r} is not bound to teams "
                             f"(auth.dataplane_tokens_ref.{identity.name}.teams): "
                             "credentials go only to planes bound to the teams they serve")
        if req.team not in identity.teams:
            raise NotGranted(f"token {identity.name!r} does not serve team {req.team!r} "
                             f"(auth.dataplane_tokens_ref.{identity.name}.teams)")
        if entry.teams is not None and req.team not in entry.teams:
            raise NotGranted(f"credential {req.credential!r} is not for team {req.team!r} "
                             f"(credentials.{req.credential}.teams)")
        return entry

    async def issue(self, entry: BrokeredCredential, req: CredentialRequest,
                    plane: str) -> CredentialAnswer:
        """One STS session of ``entry``'s role for ``req.team`` on ``plane``."""
        aws = entry.aws
        session = _UNSAFE.sub("_", f"{aws.session_name}-{req.team}@{plane}")[:64]
        settings = msgspec.structs.replace(
            aws, session_name=session,
            session_tags={**aws.session_tags, "team": req.team, "dataplane": plane})
        where = f"credentials.{req.credential}.aws"
        try:
            got = await asyncio.to_thread(fetch_aws, settings, where=where)
        except Exception as exc:
            # botocore's errors name the refusal (AccessDenied, an unreachable endpoint),
            # never the secret they were signed with.
            raise IssueFailed(f"credential {req.credential!r}: the STS did not issue a "
                              f"session: {type(exc).__name__}: {exc}") from exc
        creds, expires_at = got.value, got.expires_at
        # An AssumeRole answer always has all three and an expiry.
        assert creds.access_key and creds.secret_key and creds.token
        assert expires_at is not None
        expiration = datetime.fromtimestamp(expires_at, UTC).isoformat()
        return CredentialAnswer(
            credential=req.credential, team=req.team, session_name=session,
            access_key_id=creds.access_key, secret_access_key=creds.secret_key,
            session_token=creds.token, expiration=expiration)


@post("/v1alpha1/credentials", status_code=200)
async def credentials(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Short-lived cloud credentials for a team the calling plane serves (data-plane
    tokens bound to teams only)."""
    auth: TokenAuth = request.app.state.auth
    identity = auth.require_dataplane(request.headers.get("authorization"))
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise BadRequest(f"body: larger than {MAX_BODY_BYTES} bytes")
    req = decode_body(body, CredentialRequest, what="a credential request")
    plane = req.dataplane_id or identity.name
    broker: CredentialBroker = request.app.state.credentials
    try:
        if req.dataplane_id is not None:
            auth.require_plane(identity, req.dataplane_id)
        entry = broker.check(identity, req)
    except (Forbidden, NotFound) as exc:
        log.warning("credential %r for team %r refused to token %r (plane %r): %s",
                    req.credential, req.team, identity.name, plane, exc.message)
        raise
    answer = await broker.issue(entry, req, plane)
    log.info("credential %r issued to token %r (plane %r) for team %r: session %s "
             "until %s", req.credential, identity.name, plane, req.team,
             answer.session_name, answer.expiration)
    return Response(msgspec.json.encode(answer), media_type="application/json",
                    headers={"cache-control": "no-store"})


ROUTES = [credentials]
