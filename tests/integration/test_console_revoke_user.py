"""The Users page's "Revoke credentials" (``POST /admin/v1/users/{user}/revoke``), in the
app factory: a write token revokes a person (shared profile), a read token's forged
revoke is refused and changes nothing, and the local profile's refusal is shown.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from tests.integration._console import READ, WRITE, console_settings, sign_in

pytestmark = pytest.mark.integration


def _revoked(dsn: str, user: str) -> bool:
    """Whether the shared database marks ``user`` revoked."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT revoked_at FROM users WHERE name = %s", (user,)).fetchone()
    assert row is not None
    return row[0] is not None


async def test_a_write_token_revokes_a_person_and_a_read_token_cannot(
        request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Shared profile: the reader's forged revoke is a 403 and the person stays; the
    writer's answers "revoked" on the Users page, and the API says so."""
    settings = console_settings(request, "shared", tmp_path, monkeypatch)
    dsn: str = request.getfixturevalue("pg_dsn")
    async with AsyncTestClient(app=create_app(settings)) as c:
        c.follow_redirects = False
        made = await c.put("/admin/v1/users/ana", headers={
            "Authorization": f"Bearer {WRITE}", "If-Match": '"0"'}, json={"limits": {}})
        assert made.status_code == 201, made.text
        reader = await sign_in(c, READ)
        forged = await c.post("/console/users/ana/revoke", data={"csrf": reader})
        assert forged.status_code == 403 and not _revoked(dsn, "ana")
        await c.post("/console/logout", data={"csrf": reader})
        writer = await sign_in(c, WRITE)
        done = await c.post("/console/users/ana/revoke", data={"csrf": writer})
        assert done.status_code == 303 and done.headers["location"].endswith("revoked=ana")
        page = await c.get(done.headers["location"])
        assert 'data-revoked="ana"' in page.text
        assert _revoked(dsn, "ana")


async def test_the_local_profile_s_refusal_is_shown(
        request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Local profile: the API's 404 (brokered credentials live in the shared profile) is
    the page's answer, beside the user."""
    settings = console_settings(request, "local", tmp_path, monkeypatch)
    async with AsyncTestClient(app=create_app(settings)) as c:
        c.follow_redirects = False
        await c.put("/admin/v1/users/ana", headers={"Authorization": f"Bearer {WRITE}",
                                                    "If-Match": '"0"'}, json={"limits": {}})
        csrf = await sign_in(c, WRITE)
        r = await c.post("/console/users/ana/revoke", data={"csrf": csrf})
        assert r.status_code == 404 and "shared profile" in r.text
