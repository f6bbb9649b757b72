"""A lease plane's side of brokered keys: what one heartbeat answer's ``people`` does to
its SQLite key store (``SqliteKeyStore.sync_brokered``), and the wire's compatibility
with a plane or a control plane that predates the field (docs/identity.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from gateway.keys import SqliteKeyStore, TeamLimits, hash_key
from gateway.lease import BrokeredKey, People, SyncResponse

KH = {name: hash_key(f"no-secret-{name}") for name in ("ada", "bo", "cy", "di")}
REVOKED_AT = datetime(2026, 12, 7, 17, 0, 0, tzinfo=UTC)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteKeyStore]:
    keys = SqliteKeyStore(str(tmp_path / "mayu.db"))
    await keys.open()
    await keys.create_team(name="eng", limits=TeamLimits())
    try:
        yield keys
    finally:
        await keys.close()


def _key(user: str, team: str = "eng") -> tuple[str, str, str, str]:
    return (f"key_{user}", team, f"{user}@example.com", KH[user])


async def test_keys_of_its_teams_are_held_as_their_users_hashes_only(
        store: SqliteKeyStore) -> None:
    """Added once (a repeated answer adds nothing); a key of a team the plane does not
    have is skipped; a held key resolves to its user in its team."""
    assert await store.sync_brokered([_key("ada"), _key("bo", "ml")], [],
                                     complete=True) == (1, 0)
    assert await store.sync_brokered([_key("ada"), _key("bo", "ml")], [],
                                     complete=True) == (0, 0)
    ada = await store.resolve(KH["ada"])
    assert ada is not None and ada.user == "ada@example.com" and ada.team.name == "eng"
    assert ada.key_prefix == "brokered"
    assert await store.resolve(KH["bo"]) is None


async def test_a_denied_key_is_revoked_at_its_time_and_refused(store: SqliteKeyStore) -> None:
    await store.sync_brokered([_key("ada"), _key("cy")], [], complete=True)
    assert await store.sync_brokered([_key("cy")], [("key_ada", REVOKED_AT)],
                                     complete=True) == (0, 1)
    assert await store.resolve(KH["ada"]) is None
    record = await store.get_key("key_ada")
    assert record is not None and record.revoked_at == REVOKED_AT
    assert await store.resolve(KH["cy"]) is not None


async def test_a_key_missing_from_a_complete_answer_is_revoked_but_not_from_a_cut_one(
        store: SqliteKeyStore) -> None:
    """A key revoked longer ago than the deny list reaches (a plane that was away) is
    revoked as absent from a complete answer; a cut answer revokes only the denied."""
    await store.sync_brokered([_key("ada"), _key("cy")], [], complete=True)
    assert await store.sync_brokered([_key("cy")], [], complete=False) == (0, 0)
    assert await store.resolve(KH["ada"]) is not None
    assert await store.sync_brokered([_key("cy")], [], complete=True) == (0, 1)
    assert await store.resolve(KH["ada"]) is None
    # A revoked key stays revoked: the same id active again is not resurrected.
    assert await store.sync_brokered([_key("ada")], [], complete=True) == (0, 1)
    assert await store.resolve(KH["ada"]) is None


async def test_plain_keys_are_never_touched(store: SqliteKeyStore) -> None:
    plaintext, record = await store.create_key(team="eng", user="ada@example.com")
    assert await store.sync_brokered([], [(record.id, REVOKED_AT)], complete=True) == (0, 0)
    assert await store.resolve(hash_key(plaintext)) is not None


def test_the_answer_interoperates_with_planes_and_daemons_of_before() -> None:
    """An answer without ``people`` (an older inferplaned) decodes with None; a plane
    of before ignores the field it does not know."""
    old = {"namespace": "n", "generation": 1, "fingerprint": "f", "day": "2026-12-07",
           "month": "2026-12"}
    assert msgspec.json.decode(msgspec.json.encode(old), type=SyncResponse).people is None
    people = People(fingerprint="x", keys=[BrokeredKey(id="key_a", team="eng", user="a",
                                                       key_hash=KH["ada"])])
    answer = msgspec.json.encode(SyncResponse(namespace="n", generation=1, fingerprint="f",
                                              day="2026-12-07", month="2026-12",
                                              people=people))

    class Before(msgspec.Struct, kw_only=True):
        namespace: str
        generation: int

    assert msgspec.json.decode(answer, type=Before).generation == 1
    assert msgspec.json.decode(answer, type=SyncResponse).people == people
