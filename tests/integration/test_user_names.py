"""One rule for user names at every door (docs/admin-api.md, "Members and users").

A user name is 1 to 200 printable characters without '/' or an edge space, and '*' only
as a team's default member budget. Through the real app factory on both profiles, and
``mayu keys create`` as a real subprocess: a name the members/users routes could not
address ('a/b') is refused wherever it could be written (a key, a key edit, a user, the
CLI, an import), and so is a key's user '*'; a manageable name works everywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.errors import BadRequest
from gateway.keys import MemberLimits, SqliteKeyStore, TeamLimits, copy_records, read_people
from tests.integration._admin import gateway_settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WRITE = "w" * 8 + "-user-names-token"
W = {"Authorization": f"Bearer {WRITE}"}


@pytest.fixture(params=["local", "shared"])
async def client(request: pytest.FixtureRequest, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[AsyncTestClient[Any]]:
    """A fresh gateway with a write token and team t."""
    settings = gateway_settings(request, tmp_path, monkeypatch, profile=request.param,
                                tokens={"ops": ("write", WRITE)})
    async with AsyncTestClient(app=create_app(settings)) as c:
        assert (await c.post("/admin/v1/teams", json={"name": "t"}, headers=W)).is_success
        yield c


def _refused(r: Any) -> None:
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "user", r.text


async def test_a_name_the_routes_cannot_address_is_refused_at_every_door(
        client: AsyncTestClient[Any]) -> None:
    """'a/b' on a new key, a key edit and a user; '*' on a key: 400 naming user, nothing
    written. 'ana@x.org' is created on a key, then read, budgeted and deleted through
    the members and users routes."""
    for user in ("a/b", "*", " ana", "a\u0085b"):
        _refused(await client.post("/admin/v1/keys", json={"team": "t", "user": user},
                                   headers=W))
    made = (await client.post("/admin/v1/keys", json={"team": "t", "user": "ana@x.org"},
                              headers=W)).json()["key"]
    _refused(await client.patch(f"/admin/v1/keys/{made['key_id']}", json={"user": "a/b"},
                                headers=W))
    _refused(await client.patch(f"/admin/v1/keys/{made['key_id']}", json={"user": "*"},
                                headers=W))
    keys = (await client.get("/admin/v1/keys", headers=W)).json()["data"]
    assert [k["user"] for k in keys] == ["ana@x.org"]
    assert (await client.put("/admin/v1/users/a%2Fb", json={"limits": {}},
                             headers=W)).status_code in (400, 404)
    assert (await client.get("/admin/v1/users", headers=W)).json()["data"] == []
    budget = {"limits": {"usd_micros_per_day": 5}}
    r = await client.put("/admin/v1/teams/t/members/ana@x.org", json=budget["limits"],
                         headers=W)
    assert r.status_code in (200, 201), r.text
    r = await client.put("/admin/v1/users/ana@x.org", json=budget, headers=W)
    assert r.status_code in (200, 201), r.text
    assert (await client.get("/admin/v1/users/ana@x.org", headers=W)).status_code == 200
    assert (await client.delete("/admin/v1/teams/t/members/ana@x.org",
                                headers=W)).status_code == 200


def test_the_cli_refuses_the_same_names(tmp_path: Path) -> None:
    """mayu keys create --user a/b (and '*'): one line naming user, exit 2."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def mayu(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)

    assert mayu("teams", "create", "t").returncode == 0
    for user in ("a/b", "*"):
        done = mayu("keys", "create", "--team", "t", "--user", user)
        assert done.returncode == 2 and "user:" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


async def test_an_import_refuses_a_user_the_routes_cannot_address(tmp_path: Path) -> None:
    """A local store an older gateway wrote with a user 'a/b' and a key of user '*' is
    refused by the import before anything is copied."""
    import sqlite3

    path = str(tmp_path / "old.db")
    store = SqliteKeyStore(path)
    await store.open()
    await store.create_team(name="t", limits=TeamLimits())
    _, key = await store.create_key(team="t", user="bob")
    await store.put_user("ann", limits=MemberLimits())
    await store.close()
    with sqlite3.connect(path) as conn:  # as an older, lenient gateway left them
        conn.execute("UPDATE users SET name = 'a/b'")
        conn.execute("UPDATE keys SET user = '*'")
    people = await read_people(path)
    with pytest.raises(BadRequest, match="user"):
        await copy_records(None, [], [key.__class__(**{  # type: ignore[arg-type]
            **{f: getattr(key, f) for f in key.__struct_fields__}, "user": "*"})],
            people=people)
