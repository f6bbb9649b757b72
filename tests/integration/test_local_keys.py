"""The SQLite key store: hashes only, resolution, revisions, tombstones, demo bootstrap."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

import gateway.localdb as sqlite_store
from gateway.config import BootstrapTeam, load_settings
from gateway.errors import AlreadyExists, BadRequest, ConfigError, NotFound, RevisionConflict
from gateway.keys import (
    KeyLimits,
    SqliteKeyStore,
    TeamLimits,
    ensure_demo,
    ensure_teams,
    hash_key,
    open_key_store,
)
from tests.integration._local import T0, opened


@pytest.fixture
async def store(tmp_path, clock):
    async with opened(SqliteKeyStore(str(tmp_path / "keys.db"), clock=clock)) as s:
        yield s


async def test_plaintext_is_never_stored(store, tmp_path):
    """The database holds the SHA-256 and a display prefix, never the key itself."""
    await store.create_team(name="t", limits=TeamLimits())
    plaintext, record = await store.create_key(team="t", name="ci")
    assert record.key_hash == hash_key(plaintext)
    assert plaintext.startswith(record.display_prefix)
    raw = (tmp_path / "keys.db").read_bytes() + (tmp_path / "keys.db-wal").read_bytes()
    assert plaintext.encode() not in raw
    assert plaintext[len(record.display_prefix):].encode() not in raw


async def test_resolve_returns_the_principal_with_team_snapshot(store):
    """A live key resolves to its key, team limits, user, models and revisions."""
    team = await store.create_team(name="ml", limits=TeamLimits(rpm=5, usd_micros_per_day=9))
    plaintext, record = await store.create_key(
        team="ml", user="bob", allowed_models=("a", "b"), limits=KeyLimits(tpm=77))
    p = await store.resolve(hash_key(plaintext))
    assert p is not None
    assert (p.key_id, p.key_revision, p.user, p.allowed_models) == (record.id, 1, "bob",
                                                                     ("a", "b"))
    assert p.key_limits == KeyLimits(tpm=77) and p.team == team
    assert p.may_use("a") and not p.may_use("c")


async def test_unknown_revoked_and_expired_keys_do_not_resolve(store, clock):
    """resolve() answers None for an unknown hash, a revoked key and an expired key."""
    await store.create_team(name="t", limits=TeamLimits())
    revoked, rec = await store.create_key(team="t")
    expiring, _ = await store.create_key(team="t", expires_at=T0 + timedelta(hours=1))
    assert await store.resolve(hash_key("sk-inf-nope")) is None
    await store.revoke_key(rec.id)
    assert await store.resolve(hash_key(revoked)) is None
    assert await store.resolve(hash_key(expiring)) is not None
    clock.now = T0 + timedelta(hours=1)
    assert await store.resolve(hash_key(expiring)) is None


async def test_revocation_leaves_a_tombstone_and_bumps_the_revision(store):
    """A revoked key stays in the table (listed with --all) at revision 2."""
    await store.create_team(name="t", limits=TeamLimits())
    _, rec = await store.create_key(team="t")
    revoked = await store.revoke_key(rec.id, expected_revision=1)
    assert revoked.revoked_at == T0 and revoked.revision == 2
    assert await store.list_keys(team="t") == []
    assert [k.id for k in await store.list_keys(team="t", include_revoked=True)] == [rec.id]


async def test_revoke_compares_the_revision(store):
    """A revoke with a stale expected revision is refused and changes nothing."""
    await store.create_team(name="t", limits=TeamLimits())
    plaintext, rec = await store.create_key(team="t")
    with pytest.raises(RevisionConflict, match="revision 1, not 7"):
        await store.revoke_key(rec.id, expected_revision=7)
    assert await store.resolve(hash_key(plaintext)) is not None


async def test_team_edit_bumps_revision_and_compares_it(store):
    """update_team bumps the revision; a stale expected revision is refused."""
    await store.create_team(name="t", limits=TeamLimits(rpm=1))
    team = await store.update_team("t", limits=TeamLimits(rpm=2), expected_revision=1)
    assert (team.revision, team.limits.rpm) == (2, 2)
    with pytest.raises(RevisionConflict):
        await store.update_team("t", limits=TeamLimits(rpm=3), expected_revision=1)


async def test_team_lookup_by_name_or_id(store):
    """get_team finds a team by its name or its id; unknown answers None."""
    team = await store.create_team(name="alpha", limits=TeamLimits())
    assert await store.get_team("alpha") == team
    assert await store.get_team(team.id) == team
    assert await store.get_team("beta") is None


async def test_bad_input_names_the_field(store):
    """Duplicate teams, unknown teams and negative limits are refused with the field."""
    await store.create_team(name="t", limits=TeamLimits())
    with pytest.raises(AlreadyExists, match="already exists"):
        await store.create_team(name="t", limits=TeamLimits())
    with pytest.raises(NotFound, match="'nope'"):
        await store.create_key(team="nope")
    with pytest.raises(BadRequest, match=r"team limits\.rpm"):
        await store.create_team(name="u", limits=TeamLimits(rpm=-1))
    with pytest.raises(BadRequest, match=r"key limits\.tpm"):
        await store.create_key(team="t", limits=KeyLimits(tpm=1 << 40))
    with pytest.raises(BadRequest, match=r"team limits\.tpm: must be positive"):
        await store.create_team(name="v", limits=TeamLimits(tpm=0))


async def test_ensure_demo_only_on_first_run(store):
    """The first run creates team demo and returns a working key; later runs return None."""
    plaintext = await ensure_demo(store)
    assert plaintext is not None
    p = await store.resolve(hash_key(plaintext))
    assert p is not None and p.team.name == "demo"
    assert p.team.limits.rpm == 60 and p.team.limits.usd_micros_per_day == 1_000_000
    assert await ensure_demo(store) is None
    assert len(await store.list_keys()) == 1


async def test_declared_teams_are_created_once_and_conflicts_refused(store):
    """Config-declared teams are created if missing, kept if equal, refused if different."""
    decl = [BootstrapTeam(name="ops", rpm=10)]
    assert await ensure_teams(store, decl) == ["ops"]
    assert await ensure_teams(store, decl) == []
    with pytest.raises(ConfigError, match=r"bootstrap_teams\[0\]"):
        await ensure_teams(store, [BootstrapTeam(name="ops", rpm=11)])


async def test_reopen_keeps_everything(tmp_path, clock):
    """Teams, keys and tombstones persist across close/reopen of the file."""
    path = str(tmp_path / "k.db")
    s = SqliteKeyStore(path, clock=clock)
    await s.open()
    await s.create_team(name="t", limits=TeamLimits(tpm=5))
    live, _ = await s.create_key(team="t")
    _, dead = await s.create_key(team="t")
    await s.revoke_key(dead.id)
    await s.close()
    s = SqliteKeyStore(path, clock=clock)
    await s.open()
    try:
        assert (await s.resolve(hash_key(live))) is not None
        assert (await s.get_key(dead.id)).revoked_at is not None
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        await s.close()


async def test_open_key_store_uses_the_data_dir_by_default(tmp_path):
    """With key_store.type sqlite and no path, the store is <data_dir>/mayu.db."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"data_dir: {tmp_path / 'data'}\n")
    store = await open_key_store(load_settings(cfg))
    try:
        await store.create_team(name="t", limits=TeamLimits())
    finally:
        await store.close()
    assert (tmp_path / "data" / "mayu.db").exists()


async def test_close_closes_a_checkpoint_connection_still_being_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """close() while the checkpointer's connection is still being opened in a worker
    thread (a slow open, as on a loaded machine): when close() has returned and that
    thread has finished, no connection the store opened is still open. (Before: it
    stayed open, and a copy of the file taken then could be unreadable.)"""
    monkeypatch.setattr(sqlite_store, "_CHECKPOINT_S", 0.01)
    real, opened = sqlite_store.connect, []
    slow_started, slow_done = threading.Event(), threading.Event()

    def connect(path: str) -> sqlite3.Connection:
        slow = bool(opened)  # the store's own connection opens first, at full speed
        if slow:
            slow_started.set()
            time.sleep(0.3)
        conn = real(path)
        opened.append(conn)
        if slow:
            slow_done.set()
        return conn

    monkeypatch.setattr(sqlite_store, "connect", connect)
    keys = SqliteKeyStore(str(tmp_path / "keys.db"))
    await keys.open()
    await keys.create_team(name="t")  # written: the checkpointer has work to do
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, slow_started.wait, 5)
    await keys.close()
    await loop.run_in_executor(None, slow_done.wait, 5)
    assert len(opened) == 2
    for conn in opened:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            conn.execute("SELECT 1")
    assert not (tmp_path / "keys.db-wal").exists()
    reopened = SqliteKeyStore(str(tmp_path / "keys.db"))
    await reopened.open()
    try:
        assert [t.name for t in await reopened.list_teams()] == ["t"]
    finally:
        await reopened.close()
