"""The standalone warning (ADR-031) on the console's Operations page and in the API, in
the app factory: the local profile (no control plane, no OIDC issuer) shows it; the
shared profile does not, nor a local one with an OIDC issuer, nor does their
``/readyz`` carry a detail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.app import create_app
from gateway.identity import IdentitySettings, IssuerSettings
from gateway.standalone import WARNING
from tests.integration._console import READ, console_settings, sign_in

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("profile", ["local", "shared", "local-oidc"])
async def test_operations_page_warns_only_in_standalone_mode(
        request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        profile: str) -> None:
    """Local: the Operations page, /admin/v1/status and /readyz say "not recommended for
    production"; shared, or local with an OIDC issuer: none of the three does."""
    settings = console_settings(request, profile.removesuffix("-oidc"), tmp_path,
                                monkeypatch)
    if profile.endswith("-oidc"):
        settings = replace(settings, identity=IdentitySettings(issuers=[IssuerSettings(
            issuer="https://login.example.com", audience=["mayu"])]))
    async with AsyncTestClient(app=create_app(settings)) as c:
        c.follow_redirects = False
        await sign_in(c, READ)
        page = await c.get("/console/operations")
        status = await c.get("/admin/v1/status", headers={"Authorization": f"Bearer {READ}"})
        ready = await c.get("/readyz")
    assert page.status_code == 200 and status.status_code == 200 and ready.status_code == 200
    if profile == "local":
        assert "data-standalone" in page.text and "not recommended for production" in page.text
        assert status.json()["warning"] == WARNING
        assert ready.json() == {"status": "ready", "detail": WARNING}
    else:
        assert "data-standalone" not in page.text and "production" not in page.text
        assert status.json()["warning"] is None
        assert ready.json() == {"status": "ready"}
