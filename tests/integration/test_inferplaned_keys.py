"""Keys made at inferplaned's admin surface (``POST /v1alpha1/teams/{team}/keys``,
``POST /v1alpha1/keys/{id}/revoke``) and how they reach a lease plane: the heartbeat
query (:func:`controlplane.identity.people_for`, sql ``plane_keys``) against a real
migrated Postgres, applied by a plane's SQLite key store (``sync_brokered``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from controlplane import create_app
from controlplane.identity import people_for
from gateway.keys import KeyLimits, PostgresKeyStore, SqliteKeyStore, TeamLimits, hash_key
from gateway.lease import DataPlaneInfo, People, SyncRequest
from tests.integration._inferplaned import control_plane_config

pytestmark = pytest.mark.integration

WRITER = "w" * 8 + "-writer-token-k"
READER = "r" * 8 + "-reader-token-k"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def client(pg_dsn: str, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[AsyncTestClient[Any]]:
    config = control_plane_config(monkeypatch, pg_dsn, writers={"ci": WRITER},
                                  readers={"dashboards": READER})
    async with AsyncTestClient(app=create_app(config)) as c:
        store = PostgresKeyStore(c.app.state.pool)
        for team in ("eng", "ml"):
            await store.create_team(name=team, limits=TeamLimits())
        yield c


def _heartbeat(teams: list[str], people: str = "") -> SyncRequest:
    return SyncRequest(dataplane=DataPlaneInfo(id="node-a"), frame="f1", boot="b1", seq=1,
                       teams=teams, people=people)


async def _people(c: AsyncTestClient[Any], teams: list[str], people: str = ""
                  ) -> People | None:
    return await people_for(c.app.state.pool, None, _heartbeat(teams, people), None)


async def test_a_key_is_made_for_a_writer_only_and_its_secret_answered_once(
        client: AsyncTestClient[Any]) -> None:
    made = await client.post("/v1alpha1/teams/eng/keys", headers=bearer(WRITER),
                             json={"name": "ci bot", "user": "ada@example.com"})
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["key"].startswith("sk-inf-") and body["team"] == "eng"
    assert body["user"] == "ada@example.com" and body["revoked_at"] is None
    record = await PostgresKeyStore(client.app.state.pool).get_key(body["id"])
    assert record is not None and record.key_hash == hash_key(body["key"])
    assert body["key"] not in repr(record)

    refused = await client.post("/v1alpha1/teams/eng/keys", headers=bearer(READER), json={})
    assert refused.status_code == 403, refused.text
    assert (await client.post("/v1alpha1/teams/eng/keys", json={})).status_code == 401
    limits = await client.post("/v1alpha1/teams/eng/keys", headers=bearer(WRITER),
                               json={"rpm": 5})
    assert limits.status_code == 400 and "name and user only" in limits.text
    long = await client.post("/v1alpha1/teams/eng/keys", headers=bearer(WRITER),
                             json={"name": "x" * 201})
    assert long.status_code == 400 and "name" in long.text, long.text
    missing = await client.post("/v1alpha1/teams/nope/keys", headers=bearer(WRITER),
                                json={})
    assert missing.status_code == 404 and "nope" in missing.text
    gone = await client.post("/v1alpha1/keys/key_nope/revoke", headers=bearer(WRITER))
    assert gone.status_code == 404


async def test_a_heartbeat_carries_the_teams_keys_and_a_plane_holds_then_revokes_them(
        client: AsyncTestClient[Any], tmp_path: Path) -> None:
    """The answer carries the plane's teams' keys (hash, user, name), none of another
    team and none with a per-key limit the plane would not enforce; the plane admits
    the key as that team and user; after the revoke the next answer denies it, and the
    plane refuses it with the revoke's own time. A key made on the plane is untouched."""
    pg = PostgresKeyStore(client.app.state.pool)
    made = (await client.post("/v1alpha1/teams/eng/keys", headers=bearer(WRITER),
                              json={"name": "ci bot", "user": "ada@example.com"})).json()
    teamless = (await client.post("/v1alpha1/teams/eng/keys", headers=bearer(WRITER),
                                  json={})).json()
    other = (await client.post("/v1alpha1/teams/ml/keys", headers=bearer(WRITER),
                               json={})).json()
    limited, limited_record = await pg.create_key(team="eng", limits=KeyLimits(rpm=5))

    people = await _people(client, ["eng"])
    assert people is not None and people.complete and people.denied == []
    by_id = {k.id: k for k in people.keys}
    assert set(by_id) == {made["id"], teamless["id"]}
    ada = by_id[made["id"]]
    assert (ada.team, ada.user, ada.name, ada.brokered) == ("eng", "ada@example.com",
                                                             "ci bot", False)
    assert ada.key_hash == hash_key(made["key"]) and by_id[teamless["id"]].user == ""
    assert await _people(client, ["eng"], people.fingerprint) is None  # unchanged: nothing

    plane = SqliteKeyStore(str(tmp_path / "mayu.db"))
    await plane.open()
    try:
        await plane.create_team(name="eng", limits=TeamLimits())
        local, _ = await plane.create_key(team="eng", user="bo@example.com")
        keys = [(k.id, k.team, k.user, k.key_hash, k.brokered, k.name) for k in people.keys]
        assert await plane.sync_brokered(keys, [], complete=True) == (2, 0)
        principal = await plane.resolve(hash_key(made["key"]))
        assert principal is not None and principal.team.name == "eng"
        assert principal.user == "ada@example.com" and principal.key_prefix == "inferplaned"
        nobody = await plane.resolve(hash_key(teamless["key"]))
        assert nobody is not None and nobody.user is None
        for absent in (other["key"], limited):
            assert await plane.resolve(hash_key(absent)) is None

        revoked = await client.post(f"/v1alpha1/keys/{made['id']}/revoke",
                                    headers=bearer(WRITER))
        assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
        after = await _people(client, ["eng"], people.fingerprint)
        assert after is not None and [k.id for k in after.keys] == [teamless["id"]]
        assert [(d.id, d.user) for d in after.denied] == [(made["id"], "ada@example.com")]
        keys = [(k.id, k.team, k.user, k.key_hash, k.brokered, k.name) for k in after.keys]
        assert await plane.sync_brokered(
            keys, [(d.id, d.revoked_at) for d in after.denied], complete=True) == (0, 1)
        assert await plane.resolve(hash_key(made["key"])) is None
        held = await plane.get_key(made["id"])
        assert held is not None and held.revoked_at == after.denied[0].revoked_at
        assert await plane.resolve(hash_key(teamless["key"])) is not None
        assert await plane.resolve(hash_key(local)) is not None
    finally:
        await plane.close()
    assert limited_record.id not in {k.id for k in after.keys}


async def test_a_key_rotated_in_postgres_takes_its_new_hash_on_the_plane(
        client: AsyncTestClient[Any], tmp_path: Path) -> None:
    """The next answer carries the new hash; the plane replaces the one it held (the old
    secret is refused there at once), the key keeps its id."""
    made = (await client.post("/v1alpha1/teams/eng/keys", headers=bearer(WRITER),
                              json={"name": "rotated"})).json()
    plane = SqliteKeyStore(str(tmp_path / "mayu.db"))
    await plane.open()
    try:
        await plane.create_team(name="eng", limits=TeamLimits())
        first = await _people(client, ["eng"])
        assert first is not None
        keys = [(k.id, k.team, k.user, k.key_hash, k.brokered, k.name) for k in first.keys]
        assert await plane.sync_brokered(keys, [], complete=True) == (1, 0)
        rotation = await PostgresKeyStore(client.app.state.pool).rotate_key(
            made["id"], grace_s=0)
        second = await _people(client, ["eng"], first.fingerprint)
        assert second is not None and [k.key_hash for k in second.keys] == [
            hash_key(rotation.secret)]
        keys = [(k.id, k.team, k.user, k.key_hash, k.brokered, k.name) for k in second.keys]
        assert await plane.sync_brokered(keys, [], complete=True) == (0, 0)
        assert await plane.resolve(hash_key(made["key"])) is None
        principal = await plane.resolve(hash_key(rotation.secret))
        assert principal is not None and principal.key_id == made["id"]
    finally:
        await plane.close()
