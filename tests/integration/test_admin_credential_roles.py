"""The admin API takes a brokered gateway credential (``identity.broker``) as the bearer of
a member: the credential is signed as inferplaned signs (:class:`CredentialIssuer`), its
JWKS served over real HTTP from a thread, and the app verifies it as on the request path.

The holder reads only routes naming themselves, within their team; every write and any
other team or user is a 403; once the key the credential stands for is revoked, the same
credential is a 401.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.app import create_app
from gateway.identity import (
    CredentialIssuer,
    CredentialSettings,
    IdentitySettings,
    IssuerSettings,
)
from gateway.keys import hash_key
from tests.integration._admin import WRITE, gateway_settings
from tests.json_http import serving

pytestmark = pytest.mark.integration
ISSUER = "https://inferplaned.test"
SIGNER = CredentialIssuer(CredentialSettings(issuer=ISSUER, signing_keys_ref=["env:UNUSED"]),
                          ["credential-roles-signing-secret-" + "s" * 16])
USER = "cred@example.com"


@pytest.fixture(scope="module")
def jwks_url() -> Iterator[str]:
    """inferplaned's JWKS as a gateway fetches it, from a local HTTP server."""
    with serving({"/v1alpha1/jwks.json": SIGNER.jwks()}) as base:
        yield f"{base}/v1alpha1/jwks.json"


async def _permit(c: AsyncTestClient[Any], secret: str, user: str) -> str:
    """One request with the key ``secret`` of ``user``: its permit id."""
    r = await c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                     json={"model": "mock-gpt", "max_tokens": 8,
                           "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    log = await c.get("/admin/v1/requests", params={"user": user},
                      headers={"Authorization": f"Bearer {WRITE}"})
    return str(log.json()["data"][0]["permit_id"])


async def test_a_gateway_credential_reads_only_its_holder_s_own(
        request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        jwks_url: str) -> None:
    """Own requests (the list and one), member budget: 200; another's request: 404; all
    requests, another user, another team, a second user or team beside its own, any
    write: 403; after its key is revoked: 401."""
    settings = gateway_settings(request, tmp_path, monkeypatch, profile="local")
    broker = IssuerSettings(issuer=ISSUER, audience=["mayu"], algorithms=("EdDSA",),
                            user_claim="sub", jwks_url=jwks_url)
    settings = replace(settings, identity=IdentitySettings(broker=broker))
    w = {"Authorization": f"Bearer {WRITE}"}
    async with AsyncTestClient(app=create_app(settings)) as c:
        for team in ("alpha", "beta"):
            assert (await c.post("/admin/v1/teams", headers=w, json={"name": team})).is_success
        made = (await c.post("/admin/v1/keys", headers=w,
                             json={"team": "alpha", "user": USER})).json()
        other = (await c.post("/admin/v1/keys", headers=w,
                              json={"team": "alpha", "user": "o@x.com"})).json()
        permits = {u: await _permit(c, secret, u)
                   for u, secret in ((USER, made["secret"]), ("o@x.com", other["secret"]))}
        credential, _ = SIGNER.issue(user=USER, team="alpha", key_hash=hash_key(made["secret"]))
        me = {"Authorization": f"Bearer {credential}"}
        assert (await c.get(f"/admin/v1/requests/{permits[USER]}", headers=me)
                ).status_code == 200
        assert (await c.get(f"/admin/v1/requests/{permits['o@x.com']}", headers=me)
                ).status_code == 404
        for path, params in (("/admin/v1/requests", {"user": USER}),
                             (f"/admin/v1/teams/alpha/members/{USER}", {}),
                             ("/admin/v1/requests/summary", {"user": USER, "team": "alpha"})):
            r = await c.get(path, params=params, headers=me)
            assert r.status_code == 200, (path, r.text)
        for path, params in (("/admin/v1/requests", {}),
                             ("/admin/v1/requests", {"user": "other@example.com"}),
                             ("/admin/v1/teams/beta", {}), ("/admin/v1/teams", {}),
                             ("/admin/v1/requests", {"user": USER, "team": "beta"}),
                             ("/admin/v1/requests", [("user", "o@x.com"), ("user", USER)]),
                             ("/admin/v1/requests/summary",
                              [("user", USER), ("team", "beta"), ("team", "alpha")])):
            r = await c.get(path, params=params, headers=me)
            assert r.status_code == 403, (path, params, r.text)
        assert (await c.post("/admin/v1/teams", headers=me,
                             json={"name": "gamma"})).status_code == 403
        assert (await c.put(f"/admin/v1/teams/alpha/members/{USER}", headers=me,
                            json={"usd_micros_per_day": 1})).status_code == 403
        revoked = await c.post(f"/admin/v1/keys/{made['key']['key_id']}/revoke", headers=w)
        assert revoked.is_success, revoked.text
        r = await c.get("/admin/v1/requests", params={"user": USER}, headers=me)
        assert r.status_code == 401, r.text
