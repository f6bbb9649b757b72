"""``mayu keys import``: a local SQLite key store copied verbatim into Postgres."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from gateway.keys import (
    KeyLimits,
    MemberLimits,
    PostgresKeyStore,
    SqliteKeyStore,
    TeamLimits,
    hash_key,
)
from gateway.keys._import import ImportConflict, import_records, read_people, read_sqlite
from tests.conftest import ROOT


async def _local_store(path: Path) -> dict[str, str]:
    """Two teams and three keys (one revoked, one expiring); returns name -> plaintext."""
    store = SqliteKeyStore(str(path))
    await store.open()
    try:
        await store.create_team(name="alpha", limits=TeamLimits(tpm=1_000,
                                                                usd_micros_per_day=5_000))
        await store.create_team(name="beta")
        a, _ = await store.create_key(team="alpha", name="a", user="ann",
                                      allowed_models=("m1",),
                                      limits=KeyLimits(rpm=5),
                                      expires_at=datetime.now(UTC) + timedelta(days=3))
        b, _ = await store.create_key(team="beta", name="b")
        c, revoked = await store.create_key(team="beta", name="c")
        await store.revoke_key(revoked.id)
    finally:
        await store.close()
    return {"a": a, "b": b, "c": c}


async def test_import_copies_everything_and_retry_is_a_noop(pg_pool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Hashes, ids, revisions, timestamps and tombstones arrive unchanged; keys work with
    their old plaintext, the revoked one stays revoked; an identical retry adds nothing."""
    plain = await _local_store(tmp_path / "mayu.db")
    teams, keys = await read_sqlite(str(tmp_path / "mayu.db"))
    report = await import_records(pg_pool, teams, keys)
    assert (report.teams_added, report.keys_added) == (2, 3)
    pg = PostgresKeyStore(pg_pool)
    assert sorted(await pg.list_keys(include_revoked=True), key=lambda k: k.id) == \
        sorted(keys, key=lambda k: k.id)
    assert sorted(await pg.list_teams(), key=lambda t: t.id) == sorted(teams, key=lambda t: t.id)
    principal = await pg.resolve(hash_key(plain["a"]))
    assert principal is not None and principal.user == "ann"
    assert principal.team.limits == TeamLimits(tpm=1_000, usd_micros_per_day=5_000)
    assert await pg.resolve(hash_key(plain["c"])) is None
    again = await import_records(pg_pool, teams, keys)
    assert (again.teams_added, again.keys_added) == (0, 0)
    assert (again.teams_unchanged, again.keys_unchanged) == (2, 3)


async def test_conflicting_import_rolls_back_everything(pg_pool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A key edited since the first import conflicts: the import fails naming the field,
    and nothing of it (not even a new team) reaches the destination."""
    path = tmp_path / "mayu.db"
    await _local_store(path)
    teams, keys = await read_sqlite(str(path))
    await import_records(pg_pool, teams, keys)
    store = SqliteKeyStore(str(path))
    await store.open()
    await store.create_team(name="gamma")
    live = next(k for k in keys if k.revoked_at is None)
    await store.revoke_key(live.id)
    await store.close()
    teams2, keys2 = await read_sqlite(str(path))
    with pytest.raises(ImportConflict, match=f"key {live.id}: differs in revision, revoked_at"):
        await import_records(pg_pool, teams2, keys2)
    pg = PostgresKeyStore(pg_pool)
    assert await pg.get_team("gamma") is None
    assert (await pg.get_key(live.id)).revoked_at is None  # type: ignore[union-attr]


def test_cli_imports_into_the_configured_database(pg_dsn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`mayu keys import --from FILE --config SHARED.yaml` imports and prints the counts
    (the spend it moved: none from a file that holds only keys)."""
    import asyncio

    asyncio.run(_local_store(tmp_path / "mayu.db"))
    config = tmp_path / "shared.yaml"
    config.write_text(yaml.safe_dump({
        "key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
        "database": {"dsn_ref": "env:INFERPLANE_DATABASE_URL"}}))
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "keys", "import", "--from", str(tmp_path / "mayu.db"),
         "--config", str(config), "--json"], cwd=ROOT, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "INFERPLANE_DATABASE_URL": pg_dsn}, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {k: report[k] for k in ("keys_added", "keys_unchanged", "teams_added",
                                   "teams_unchanged")} == {
        "keys_added": 3, "keys_unchanged": 0, "teams_added": 2, "teams_unchanged": 0}
    # A key store file without governance tables has no spend to move.
    assert (report["spend"]["permits_added"], report["dry_run"]) == (0, False)
    assert "1 revoked" in done.stderr


async def test_import_carries_member_and_user_budgets(pg_pool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A member budget, a team's default member budget and a user budget arrive with
    their revisions: the imported key resolves with the same budgets as it did locally;
    an identical retry adds nothing; a budget edited locally since is a conflict that
    imports nothing."""
    path = tmp_path / "mayu.db"
    plain = await _local_store(path)
    store = SqliteKeyStore(str(path))
    await store.open()
    try:
        await store.put_member("alpha", "ann", limits=MemberLimits(usd_micros_per_day=2_000))
        await store.put_member("alpha", "*", limits=MemberLimits(tokens_per_day=100))
        await store.put_user("ann", email="ann@example.com",
                             limits=MemberLimits(usd_micros_per_month=9_000))
        local = await store.resolve(hash_key(plain["a"]))
    finally:
        await store.close()
    assert local is not None and local.member_limits is not None
    teams, keys = await read_sqlite(str(path))
    people = await read_people(str(path))
    report = await import_records(pg_pool, teams, keys, people=people)
    assert (report.users_added, report.members_added) == (1, 2)
    shared = await PostgresKeyStore(pg_pool).resolve(hash_key(plain["a"]))
    assert shared is not None
    assert (shared.member_limits, shared.user_limits, shared.team.revision) == \
        (local.member_limits, local.user_limits, local.team.revision)
    again = await import_records(pg_pool, teams, keys, people=people)
    assert (again.users_added, again.members_added) == (0, 0)
    assert (again.users_unchanged, again.members_unchanged) == (1, 2)

    store = SqliteKeyStore(str(path))
    await store.open()
    try:
        await store.put_user("ann", limits=MemberLimits(usd_micros_per_month=1))
    finally:
        await store.close()
    with pytest.raises(ImportConflict, match="user 'ann': differs in"):
        await import_records(pg_pool, teams, keys, people=await read_people(str(path)))
    user = await PostgresKeyStore(pg_pool).get_user("ann")
    assert user is not None and user.limits == MemberLimits(usd_micros_per_month=9_000)
