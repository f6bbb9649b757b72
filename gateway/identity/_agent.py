"""The agents' side: sign in once at the IdP, then print fresh gateway credentials.

``mayu login`` runs the device authorization grant (RFC 8628) against the issuer named
in the discovery document, exchanges the ID token at inferplaned for a first gateway
credential and keeps both the IdP's refresh token and that credential in a cache file
that only its owner may read (0600, written atomically). ``mayu credential`` prints the
cached credential while it has at least ``min_valid_s`` left; else it refreshes the ID
token with the refresh token (the IdP may rotate it) and exchanges it again. Made for
Claude Code's ``apiKeyHelper`` and for Codex's provider settings (docs/identity.md).

Nothing here prints or logs a token: the user sees their name, team and where to sign
in; the credential goes to stdout only when asked for.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.errors import InferplaneError

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
EXCHANGE_GRANT = "urn:ietf:params:oauth:grant-type:token-exchange"
ID_TOKEN = "urn:ietf:params:oauth:token-type:id_token"


class SignInFailed(InferplaneError):
    """Signing in or refreshing the gateway credential failed."""

    status = 401


def default_cache() -> Path:
    """``$MAYU_CREDENTIALS``, else ``~/.config/mayu/credentials.json``."""
    env = os.environ.get("MAYU_CREDENTIALS")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "mayu" / "credentials.json"


@dataclass
class Session:
    """What the cache file holds (its owner's secrets: 0600)."""

    issuer: str
    client_id: str
    broker: str
    team: str | None
    refresh_token: str
    credential: str = ""
    expires_at: int = 0
    user: str = ""


def save(path: Path, session: Session) -> None:
    """Write the cache atomically, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".credentials-")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(session), f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path) -> Session:
    try:
        data = json.loads(path.read_text())
        return Session(**data)
    except FileNotFoundError as exc:
        raise SignInFailed(f"no credentials at {path}: run `mayu login` first") from exc
    except (ValueError, TypeError) as exc:
        raise SignInFailed(f"{path}: not a mayu credentials file; run `mayu login`") from exc


def _json(r: httpx.Response, what: str) -> dict[str, Any]:
    try:
        doc = r.json()
    except ValueError as exc:
        raise SignInFailed(f"{what}: HTTP {r.status_code}, not JSON") from exc
    if not isinstance(doc, dict):
        raise SignInFailed(f"{what}: HTTP {r.status_code}, not a JSON object")
    return doc


def _oauth_failure(doc: dict[str, Any], what: str) -> SignInFailed:
    error, desc = doc.get("error", "error"), doc.get("error_description", "")
    return SignInFailed(f"{what}: {error}" + (f" ({desc})" if desc else ""))


def discover(client: httpx.Client, issuer: str) -> dict[str, Any]:
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    return _json(client.get(url), f"discovery at {url}")


def device_sign_in(client: httpx.Client, issuer: str, client_id: str, *, scope: str,
                   tell: Callable[[str], None],
                   sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """The token response of a completed device authorization grant."""
    meta = discover(client, issuer)
    endpoint = meta.get("device_authorization_endpoint")
    if not isinstance(endpoint, str):
        raise SignInFailed(f"{issuer} offers no device authorization grant")
    start = client.post(endpoint, data={"client_id": client_id, "scope": scope})
    grant = _json(start, "device authorization")
    if start.status_code != 200:
        raise _oauth_failure(grant, "device authorization")
    complete = grant.get("verification_uri_complete")
    tell(f"To sign in, open {complete}" if complete else
         f"To sign in, open {grant['verification_uri']} and enter {grant['user_code']}")
    interval = float(grant.get("interval", 5))
    deadline = time.monotonic() + float(grant.get("expires_in", 600))
    while time.monotonic() < deadline:
        sleep(interval)
        r = client.post(meta["token_endpoint"], data={
            "grant_type": DEVICE_GRANT, "device_code": grant["device_code"],
            "client_id": client_id})
        doc = _json(r, "device token")
        if r.status_code == 200:
            return doc
        if doc.get("error") == "slow_down":
            interval += 5
        elif doc.get("error") != "authorization_pending":
            raise _oauth_failure(doc, "sign-in")
    raise SignInFailed("sign-in: the device code expired before it was approved")


def exchange(client: httpx.Client, session: Session, id_token: str) -> Session:
    """``session`` with a new gateway credential for ``id_token`` (RFC 8693)."""
    form = {"grant_type": EXCHANGE_GRANT, "subject_token": id_token,
            "subject_token_type": ID_TOKEN}
    if session.team:
        form["team"] = session.team
    r = client.post(session.broker.rstrip("/") + "/v1alpha1/token", data=form)
    doc = _json(r, "token exchange")
    if r.status_code != 200:
        raise _oauth_failure(doc, "token exchange at inferplaned")
    session.credential = str(doc["access_token"])
    session.expires_at = int(doc.get("expires_at") or time.time() + int(doc["expires_in"]))
    session.user, session.team = str(doc.get("user", "")), str(doc.get("team") or "") or None
    return session


def refresh(client: httpx.Client, session: Session) -> Session:
    """A new ID token from the refresh token (kept, or the rotated one), exchanged."""
    meta = discover(client, session.issuer)
    r = client.post(meta["token_endpoint"], data={
        "grant_type": "refresh_token", "refresh_token": session.refresh_token,
        "client_id": session.client_id})
    doc = _json(r, "refresh")
    if r.status_code != 200 or "id_token" not in doc:
        raise SignInFailed("the sign-in expired or was revoked: run `mayu login` again "
                           f"({doc.get('error', 'no id_token')})")
    session.refresh_token = str(doc.get("refresh_token") or session.refresh_token)
    return exchange(client, session, str(doc["id_token"]))


def login(*, issuer: str, client_id: str, broker: str, team: str | None, scope: str,
          cache: Path, timeout_s: float = 30.0) -> Session:
    """Sign in with the device grant and cache the session and a first credential."""
    with httpx.Client(timeout=timeout_s) as client:
        tokens = device_sign_in(client, issuer, client_id, scope=scope,
                                tell=lambda line: print(line, file=sys.stderr, flush=True))
        if "refresh_token" not in tokens or "id_token" not in tokens:
            raise SignInFailed("sign-in: the IdP answered no id_token or refresh_token "
                               "(ask for the openid and offline_access scopes)")
        session = Session(issuer=issuer, client_id=client_id, broker=broker, team=team,
                          refresh_token=str(tokens["refresh_token"]))
        session = exchange(client, session, str(tokens["id_token"]))
    save(cache, session)
    return session


def credential(*, cache: Path, min_valid_s: float = 300.0, timeout_s: float = 30.0) -> str:
    """A gateway credential valid for at least ``min_valid_s`` (refreshed if needed)."""
    session = load(cache)
    if session.credential and session.expires_at - time.time() >= min_valid_s:
        return session.credential
    with httpx.Client(timeout=timeout_s) as client:
        session = refresh(client, session)
    save(cache, session)
    return session.credential
