"""``mayu migrate`` is not subject to the gateway's ``database.statement_timeout_s``.

The timeout is set on the pooled sessions of ``mayu serve`` (``gateway.db.open_pool``);
a migration connects with the DSN alone, so it may wait for a lock (a second migrator,
a gateway's long transaction) as long as that takes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import yaml

from gateway.schema import code_heads

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MIGRATION_LOCK = 4_651_238_117_001
"""The advisory lock every migration takes first (``migrations/env.py``)."""
STATEMENT_TIMEOUT_S = 0.5


def _waiting_on_the_lock(admin: psycopg.Connection[tuple[object, ...]], db: str) -> bool:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
        " AND wait_event_type = 'Lock' AND wait_event = 'advisory'", (db,)).fetchone()
    return row is not None and int(str(row[0])) > 0


def test_migrate_waits_out_a_lock_longer_than_the_statement_timeout(
        tmp_path: Path, pg_empty_dsn: str) -> None:
    """With statement_timeout_s 0.5, mayu migrate blocked 4x as long on its advisory lock
    still applies every revision."""
    config = tmp_path / "mayu.yaml"
    config.write_text(yaml.safe_dump({
        "key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
        "database": {"dsn_ref": "env:IPT_STALL_DSN",
                     "statement_timeout_s": STATEMENT_TIMEOUT_S}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "IPT_STALL_DSN": pg_empty_dsn}
    with psycopg.connect(pg_empty_dsn, autocommit=True) as admin:
        db = str(admin.info.dbname)
        admin.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        migrate = subprocess.Popen(
            [sys.executable, "-m", "gateway", "migrate", "--config", str(config)],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        try:
            deadline = time.monotonic() + 60  # a hang guard: the subprocess's start-up
            while not _waiting_on_the_lock(admin, db):
                assert migrate.poll() is None, migrate.communicate()
                assert time.monotonic() < deadline, "mayu migrate never reached its lock"
                time.sleep(0.05)
            time.sleep(4 * STATEMENT_TIMEOUT_S)  # blocked well past the timeout
            admin.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
            out, err = migrate.communicate(timeout=120)
        finally:
            if migrate.poll() is None:
                migrate.kill()
                migrate.wait()
    assert migrate.returncode == 0, err
    assert " applied " in out
    with psycopg.connect(pg_empty_dsn) as conn:
        heads = [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]
    assert heads == list(code_heads())
