"""The admin API's access tiers are checked before anything the request carries is read.

Both profiles, through the real app factory: a body or a parameter the route would
refuse tells a caller without the right credential nothing (401 without a token, 403
for a read token's write); the key's own routes take a key and no admin token, the
admin routes an admin token and no key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from tests.integration._admin import READ, WRITE, bearer

pytestmark = pytest.mark.integration


def _code(r: Any) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"]


async def test_the_tier_is_checked_before_the_body_and_the_parameters(
        admin: tuple[AsyncTestClient[Any], Path]) -> None:
    """A malformed team body is a 401 without a token and a 403 with a read token (only
    the write token learns it is a 400); a bad ``limit`` is a 401 without a token."""
    c, _ = admin
    bad = {"name": 5}
    assert _code(await c.post("/admin/v1/teams", json=bad)) == (401, "invalid_api_key")
    assert _code(await c.post("/admin/v1/teams", json=bad, headers=bearer(READ))) == (
        403, "permission_denied")
    assert _code(await c.post("/admin/v1/teams", json=bad, headers=bearer(WRITE))) == (
        400, "invalid_request")
    assert _code(await c.get("/admin/v1/teams?limit=0")) == (401, "invalid_api_key")
    assert _code(await c.get("/admin/v1/teams?limit=0", headers=bearer(READ))) == (
        400, "invalid_request")


async def test_a_keys_own_routes_take_a_key_and_admin_routes_an_admin_token(
        admin: tuple[AsyncTestClient[Any], Path]) -> None:
    """``/v1/me/revoke`` and ``/v1/me/requests`` refuse no key and an admin token (401);
    ``/admin/v1/requests`` refuses a key (401); each answers its own credential."""
    c, _ = admin
    assert (await c.post("/admin/v1/teams", json={"name": "ml"},
                         headers=bearer(WRITE))).status_code == 201
    made = await c.post("/admin/v1/keys", json={"team": "ml"}, headers=bearer(WRITE))
    secret = made.json()["secret"]
    for method, path in (("POST", "/v1/me/revoke"), ("GET", "/v1/me/requests")):
        for headers in ({}, bearer(WRITE)):
            r = await c.request(method, path, headers=headers)
            assert _code(r) == (401, "invalid_api_key"), (path, headers, r.text)
    assert _code(await c.get("/admin/v1/requests", headers=bearer(secret))) == (
        401, "invalid_api_key")
    assert (await c.get("/admin/v1/requests", headers=bearer(READ))).status_code == 200
    assert (await c.get("/v1/me/requests", headers=bearer(secret))).status_code == 200
    revoked = await c.post("/v1/me/revoke", headers=bearer(secret))
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    assert _code(await c.get("/v1/me/requests", headers=bearer(secret))) == (
        401, "invalid_api_key")
