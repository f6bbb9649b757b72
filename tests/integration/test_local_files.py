"""The local profile's SQLite file as every store opens it (:mod:`gateway.localdb`).

The file, its ``-wal`` and its ``-shm`` are the owner's only (0600), also when the umask
would allow more and when an existing file was wider; a file created by a pre-release
build is refused, unchanged, naming what it lacks; the lease file, on the same base as
the other stores, keeps the plane's frame, id and last applied policy set.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.alerts._stores import SqliteAlertStore
from gateway.errors import ConfigError
from gateway.governance import LocalGovernanceStore
from gateway.keys import SqliteKeyStore, TeamLimits
from gateway.lease import LeaseFile
from gateway.lease._local import Figures, SavedPolicy


@pytest.fixture
def wide_umask() -> Iterator[None]:
    """Files created with the usual 0644 unless the stores narrow them."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _modes(db: Path) -> dict[str, str]:
    return {p.name: oct(stat.S_IMODE(p.stat().st_mode))
            for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists()}


async def test_the_file_and_its_wal_and_shm_are_the_owners_only(tmp_path: Path,
                                                                 wide_umask: None) -> None:
    db = tmp_path / "data" / "mayu.db"
    keys, gov = SqliteKeyStore(str(db)), LocalGovernanceStore(str(db))
    alerts, lease = SqliteAlertStore(str(db)), LeaseFile(str(db))
    await keys.open()
    await gov.open()
    await alerts.open()
    try:
        await lease.open(dataplane_id=None, default_id="plane-1")
        await keys.create_team(name="t", limits=TeamLimits(rpm=5))
        modes = _modes(db)
        assert set(modes) == {"mayu.db", "mayu.db-wal", "mayu.db-shm"}
        assert modes == dict.fromkeys(modes, "0o600")
    finally:
        for store in (lease, alerts, gov, keys):
            await store.close()
    assert _modes(db) == dict.fromkeys(_modes(db), "0o600")


async def test_a_wider_existing_file_is_narrowed(tmp_path: Path, wide_umask: None) -> None:
    db = tmp_path / "mayu.db"
    plain = sqlite3.connect(db)  # keeps the -wal and -shm while the store opens
    plain.execute("PRAGMA journal_mode=WAL")
    plain.execute("CREATE TABLE other (x INTEGER)")
    assert _modes(db) == dict.fromkeys(["mayu.db", "mayu.db-wal", "mayu.db-shm"], "0o644")
    keys = SqliteKeyStore(str(db))
    await keys.open()
    try:
        assert _modes(db) == dict.fromkeys(["mayu.db", "mayu.db-wal", "mayu.db-shm"], "0o600")
    finally:
        await keys.close()
        plain.close()


async def test_a_pre_release_file_is_refused_unchanged(tmp_path: Path) -> None:
    """Tables without a column of the present schema: refused, naming table and
    columns; nothing is created or altered."""
    db = tmp_path / "mayu.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE teams (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE,"
                     " rpm INTEGER, tpm INTEGER, tokens_per_day INTEGER,"
                     " usd_micros_per_day INTEGER, usd_micros_per_month INTEGER,"
                     " region TEXT, guardrails TEXT NOT NULL DEFAULT '[]',"
                     " revision INTEGER NOT NULL DEFAULT 1, created_at TEXT NOT NULL)")
        conn.execute("CREATE TABLE gov_settlements (permit_id TEXT PRIMARY KEY,"
                     " kind TEXT NOT NULL, fingerprint TEXT NOT NULL)")
    conn.close()
    with pytest.raises(ConfigError, match=r"pre-release build.*table teams has no "
                                          r"budget_fit_floor\)"):
        await SqliteKeyStore(str(db)).open()
    with pytest.raises(ConfigError, match=r"table gov_settlements has no tokens_committed, "
                                          r"usd_committed, .*resolved_us\)"):
        await LocalGovernanceStore(str(db)).open()
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert tables == {"teams", "gov_settlements", "sqlite_autoindex_teams_1",
                      "sqlite_autoindex_teams_2", "sqlite_autoindex_gov_settlements_1"}


async def test_the_lease_file_keeps_frame_id_policy_and_reads_account_figures(
        tmp_path: Path) -> None:
    db = str(tmp_path / "mayu.db")
    first = LeaseFile(db)
    frame, plane = await first.open(dataplane_id=None, default_id="host-a")
    try:
        assert plane == "host-a" and len(frame) == 32
        assert await first.saved_policy() is None
        assert await first.figures(["2026-11"]) == {}  # no governance tables in the file
        saved = SavedPolicy("ns", 3, "fp", {"team-a": {"kind": "Budget"}})
        await first.save_policy(saved)
    finally:
        await first.close()

    gov = LocalGovernanceStore(db)
    await gov.open()
    await gov.close()
    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO gov_counters (counter, kind, dimension, reserved, committed,"
            " liability) VALUES (?, ?, 'usd', ?, ?, ?)",
            [("account:a:usd:month:2026-11", "account", 5, 7, 2),
             ("account:a:usd:month:2026-10", "account", 1, 1, 1),
             ("team:t:usd:month:2026-11", "window", 9, 9, 9)])
    conn.close()

    again = LeaseFile(db)
    assert await again.open(dataplane_id=None, default_id="host-b") == (frame, "host-a")
    try:
        assert await again.saved_policy() == saved
        assert await again.figures(["2026-11"]) == {
            "account:a:usd:month:2026-11": Figures(committed=7, liability=2, reserved=5)}
    finally:
        await again.close()
    named = LeaseFile(db)
    assert await named.open(dataplane_id="node-7", default_id="host-b") == (frame, "node-7")
    await named.close()
