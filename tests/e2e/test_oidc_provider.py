"""The identity tests' OIDC provider (tests/e2e/_oidc.py) does what they rely on.

Discovery names a JWKS whose keys carry ``kid``s; the device grant and the authorization
code grant with PKCE (S256) both end in an ID token for the signed-in user, with a
refresh token that keeps that user; a rotation signs with the new key while the old one
stays published until retired. Checked with PyJWT, as a relying party would.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import jwt
import pytest

from tests.e2e._oidc import CLIENT_ID, OidcProvider

pytestmark = pytest.mark.e2e

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def _claims(oidc: OidcProvider, token: str) -> dict[str, Any]:
    """The token's claims once verified against the provider's published JWKS."""
    jwks = jwt.PyJWKClient(httpx.get(f"{oidc.issuer}/.well-known/openid-configuration")
                           .json()["jwks_uri"], cache_keys=False)
    key = jwks.get_signing_key_from_jwt(token)
    claims: dict[str, Any] = jwt.decode(token, key.key, algorithms=["RS256"],
                                        audience=CLIENT_ID, issuer=oidc.issuer)
    return claims


def test_device_grant_and_refresh_keep_the_signed_in_user(oidc: OidcProvider) -> None:
    """A device code is pending until its page is visited, then yields the user's ID
    token; its refresh token yields a new one for the same user, and only once."""
    oidc.sign_in("dev-1", email="dev1@example.com", groups=["eng"])
    start = httpx.post(f"{oidc.issuer}/device_authorization",
                       data={"client_id": CLIENT_ID, "scope": "openid"}).json()
    poll = {"grant_type": DEVICE_GRANT, "device_code": start["device_code"],
            "client_id": CLIENT_ID}
    pending = httpx.post(f"{oidc.issuer}/token", data=poll)
    assert pending.status_code == 400 and pending.json()["error"] == "authorization_pending"
    assert httpx.get(start["verification_uri_complete"]).status_code == 200
    tokens = httpx.post(f"{oidc.issuer}/token", data=poll).json()
    claims = _claims(oidc, tokens["id_token"])
    assert (claims["sub"], claims["email"], claims["groups"]) == (
        "dev-1", "dev1@example.com", ["eng"])
    refresh = {"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"],
               "client_id": CLIENT_ID}
    again = httpx.post(f"{oidc.issuer}/token", data=refresh).json()
    assert _claims(oidc, again["id_token"])["sub"] == "dev-1"
    assert httpx.post(f"{oidc.issuer}/token", data=refresh).status_code == 400


def test_authorization_code_with_pkce_signs_in_the_user(oidc: OidcProvider) -> None:
    """The authorize redirect carries a code that, with the S256 verifier, yields the
    signed-in user's ID token."""
    oidc.sign_in("lead-1", groups=["team-a"])
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(
        hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    redirect = httpx.get(f"{oidc.issuer}/authorize", params={
        "client_id": CLIENT_ID, "response_type": "code", "state": "s1",
        "redirect_uri": "http://127.0.0.1:9/cb", "code_challenge": challenge,
        "code_challenge_method": "S256"})
    query = parse_qs(urlsplit(redirect.headers["location"]).query)
    assert query["state"] == ["s1"]
    tokens = httpx.post(f"{oidc.issuer}/token", data={
        "grant_type": "authorization_code", "code": query["code"][0], "client_id": CLIENT_ID,
        "code_verifier": verifier, "redirect_uri": "http://127.0.0.1:9/cb"}).json()
    assert _claims(oidc, tokens["id_token"])["groups"] == ["team-a"]


def test_rotation_signs_with_the_new_key_and_retires_the_old(oidc: OidcProvider) -> None:
    """After a rotation tokens name the new kid, both kids are published, and a retired
    kid leaves the JWKS."""
    new, old = oidc.rotate()
    assert jwt.get_unverified_header(oidc.token("rot-1"))["kid"] == new
    published = {k["kid"] for k in httpx.get(f"{oidc.issuer}/jwks").json()["keys"]}
    assert {new, old} <= published
    oidc.retire(old)
    published = {k["kid"] for k in httpx.get(f"{oidc.issuer}/jwks").json()["keys"]}
    assert old not in published and new in published
