"""gateway.identity against the real OIDC provider: what it accepts and what it refuses.

The provider (tests/e2e/_oidc.py) signs with RS256 keys it publishes with ``kid``s; the
forged tokens are built here with PyJWT from its published key or a key of our own.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.identity import InvalidToken, IssuerSettings, JwksCache, Verifier, Verifiers
from tests.e2e._oidc import CLIENT_ID, OidcProvider

pytestmark = pytest.mark.e2e


def _settings(oidc: OidcProvider, **over: Any) -> IssuerSettings:
    base: dict[str, Any] = {"issuer": oidc.issuer, "audience": (CLIENT_ID,),
                            "team_aliases": {"eng-all": "platform"},
                            "jwks_min_refresh_s": 3600.0, **over}
    return IssuerSettings(**base)


async def _refusal(verifier: Verifier, token: str) -> str:
    with pytest.raises(InvalidToken) as refused:
        await verifier.verify(token)
    assert refused.value.status == 401
    return refused.value.message


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _hs256(claims: dict[str, Any], secret: bytes, kid: str) -> str:
    """An HS256 JWT keyed with ``secret`` (PyJWT itself refuses a PEM as an HMAC key)."""
    signing_input = f"{_b64({'alg': 'HS256', 'typ': 'JWT', 'kid': kid})}.{_b64(claims)}"
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


async def test_a_valid_token_names_the_user_and_the_aliased_teams(oidc: OidcProvider) -> None:
    """A token of the provider verifies into issuer, subject, the ``email`` user and its
    groups as teams (an aliased group by its alias)."""
    token = oidc.token("u-1", email="ada@example.com", groups=["eng-all", "ml"])
    who = (await Verifiers([_settings(oidc)]).verify(token))
    assert (who.issuer, who.subject, who.user, who.teams) == (
        oidc.issuer, "u-1", "ada@example.com", ("platform", "ml"))


async def test_each_forgery_is_refused_naming_what_failed(oidc: OidcProvider) -> None:
    """Expired, not yet valid, wrong aud, wrong iss, alg none, HS256 keyed with the
    provider's public key, a tampered payload, a foreign key's signature: each a 401."""
    verifier = Verifier(_settings(oidc, leeway_s=5))
    good = oidc.token("u-2")
    header, payload, signature = good.split(".")
    claims = jwt.decode(good, options={"verify_signature": False})
    kid = jwt.get_unverified_header(good)["kid"]
    jwk = next(k for k in httpx.get(f"{oidc.issuer}/jwks").json()["keys"] if k["kid"] == kid)
    public_pem = jwt.PyJWK(jwk).key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    own = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cases = {
        "expired": oidc.token("u-2", expires_in=-60),
        "not yet valid": oidc.token("u-2", nbf=claims["iat"] + 600),
        "audience": oidc.token("u-2", aud="someone-else"),
        "issuer": oidc.token("u-2", iss="https://idp.example.com"),
        "algorithm 'none'": f"{_b64({'alg': 'none', 'kid': kid})}.{payload}.",
        "algorithm 'HS256'": _hs256(claims, public_pem, kid),
        "signature is invalid": f"{header}.{_b64({**claims, 'sub': 'admin'})}.{signature}",
        "signature is invalid ": jwt.encode(claims, own, algorithm="RS256",
                                            headers={"kid": kid}),
    }
    for what, token in cases.items():
        assert what.strip() in await _refusal(verifier, token), what
    assert (await verifier.verify(good)).subject == "u-2"


async def test_an_unknown_kid_refetches_the_jwks_once_per_interval(oidc: OidcProvider) -> None:
    """Tokens naming made-up kids cost one JWKS fetch per refresh interval, not one each."""
    verifier = Verifier(_settings(oidc))
    assert (await verifier.verify(oidc.token("u-3"))).subject == "u-3"
    before = oidc.jwks_fetches()
    for n in range(5):
        assert "unknown or retired" in await _refusal(
            verifier, oidc.token("u-3", header={"kid": f"made-up-{n}"}))
    assert oidc.jwks_fetches() == before  # the first fetch was this interval's


async def test_rotation_new_tokens_verify_old_ones_until_retired(oidc: OidcProvider) -> None:
    """After a rotation a new key's token verifies at once (one refetch, no restart); a
    token of the old key verifies until the key leaves the JWKS."""
    verifier = Verifier(_settings(oidc, jwks_min_refresh_s=0.0, jwks_max_age_s=0.5))
    old_token = oidc.token("u-4")
    assert (await verifier.verify(old_token)).subject == "u-4"
    _, old = oidc.rotate()
    assert (await verifier.verify(oidc.token("u-4"))).subject == "u-4"
    assert (await verifier.verify(old_token)).subject == "u-4"
    oidc.retire(old)
    await asyncio.sleep(0.6)  # the cached JWKS's max age
    assert "unknown or retired" in await _refusal(verifier, old_token)


class _Outage(httpx.AsyncBaseTransport):
    """The real network until ``down`` is set, then a refused connection."""

    def __init__(self) -> None:
        self.real = httpx.AsyncHTTPTransport()
        self.down = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        return await self.real.handle_async_request(request)


async def test_an_unreachable_issuer_stops_only_tokens_of_unknown_keys(
        oidc: OidcProvider) -> None:
    """Once its JWKS is stale and the issuer unreachable, a token of a key already
    fetched still verifies; one naming an unknown kid is refused as unavailable."""
    outage = _Outage()
    settings = _settings(oidc, jwks_min_refresh_s=0.0, jwks_max_age_s=0.2)
    verifier = Verifier(settings, jwks=JwksCache(
        settings, client=httpx.AsyncClient(transport=outage)))
    token = oidc.token("u-5")
    assert (await verifier.verify(token)).subject == "u-5"
    outage.down = True
    await asyncio.sleep(0.3)
    assert (await verifier.verify(token)).subject == "u-5"
    assert "unavailable" in await _refusal(
        verifier, oidc.token("u-5", header={"kid": "another"}))
