"""A COMMIT whose acknowledgement is lost, and a read-only member, on a real Postgres.

A TCP proxy between the store and Postgres (``tests/e2e/_tcpproxy.py --drop-flag``) drops the
server's answer to the next statement and closes the connection: the statement (one
autocommit call: its COMMIT) was processed, its acknowledgement never arrives — what a
failover does to the calls in flight (PostgreSQL docs: a commit whose acknowledgement was
lost may have committed). What must hold: an admission granted that way is refunded
(settled cancelled, nothing left reserved) once the database answers again; a settlement
taken that way and replayed by the Governor's journal replay is counted once. A database
that answers read-only (a standby; here ``default_transaction_read_only``) refuses to
admit with a 503 naming it, grants nothing, and the store admits again once it is
writable (the read-only session was dropped, not kept).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict

from gateway.config import DatabaseSettings
from gateway.db import Pool, open_pool
from gateway.errors import GovernanceUnavailable
from gateway.governance import Governor, Permit, PostgresGovernanceStore
from gateway.keys import PostgresKeyStore, TeamLimits
from tests.conftest import ROOT
from tests.e2e._procs import free_port
from tests.integration._pg_helpers import principal, request
from tests.settling import exact, settlement

pytestmark = pytest.mark.integration

DEADLINE_S = 30.0  # a hang guard for the background sweep, not a timing assertion


@dataclass
class Dropping:
    """A pool on the database through the dropping proxy, and the proxy's flag."""

    pool: Pool
    flag: Path
    dsn: str

    def drop_next_answer(self) -> None:
        self.flag.touch()

    def rows(self, query: str, *params: object) -> list[tuple[object, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()


@pytest.fixture
def proxy_port(pg_dsn: str, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """The dropping proxy in front of the test database's server: (port, flag file)."""
    target = int(conninfo_to_dict(pg_dsn).get("port") or 5432)
    port, flag = free_port(), tmp_path / "drop"
    proc = subprocess.Popen([sys.executable, "-m", "tests.e2e._tcpproxy", str(port),
                             "127.0.0.1", str(target), "--drop-flag", str(flag)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    try:
        yield port, flag
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
async def dropping(pg_dsn: str, proxy_port: tuple[int, Path],
                   monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Dropping]:
    port, flag = proxy_port
    target = str(conninfo_to_dict(pg_dsn).get("port") or 5432)
    monkeypatch.setenv("INFERPLANE_DATABASE_URL",
                       pg_dsn.replace(f":{target}/", f":{port}/"))
    pool = open_pool(DatabaseSettings(pool_min_size=1, pool_max_size=2, pool_timeout_s=5.0))
    await pool.open(wait=True)
    try:
        yield Dropping(pool=pool, flag=flag, dsn=pg_dsn)
    finally:
        await pool.close()


async def _until(check: object, what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while not await asyncio.to_thread(check):  # type: ignore[arg-type]
        assert time.monotonic() < end, f"not within {DEADLINE_S}s: {what}"
        await asyncio.sleep(0.1)


async def test_an_admission_whose_commit_ack_is_lost_is_refunded_once(
        dropping: Dropping) -> None:
    """An admission committed on the server whose answer was lost is a 503 to its
    caller, and its permit, found by its request id, is settled cancelled once the
    database answers: nothing reserved, nothing committed, the next admission fits."""
    p = await principal(PostgresKeyStore(dropping.pool),
                        limits=TeamLimits(usd_micros_per_day=5_000))
    store = PostgresGovernanceStore(dropping.pool)
    try:
        dropping.drop_next_answer()
        with pytest.raises(GovernanceUnavailable) as lost:
            await store.admit([request(p, usd=4_000, rid="lost-ack")])
        assert lost.value.status == 503 and lost.value.retry_after
        assert not dropping.flag.exists()  # the proxy did drop that answer
        [(status,)] = dropping.rows("SELECT status FROM permits WHERE request_id = %s",
                                    "lost-ack")
        assert status in ("pending", "cancelled")  # it did commit on the server

        def refunded() -> bool:
            return dropping.rows("SELECT status FROM permits WHERE request_id = %s",
                                 "lost-ack") == [("cancelled",)]

        await _until(refunded, "the orphaned permit settled cancelled")
        [(reserved, committed)] = dropping.rows(
            "SELECT reserved, committed FROM counters WHERE key LIKE %s",
            f"team:{p.team_id}:usd:day:%")
        assert (reserved, committed) == (0, 0)
        [again] = await store.admit([request(p, usd=4_000, rid="after")])
        assert isinstance(again, Permit)  # the lost one no longer binds the 5,000 limit
    finally:
        await store.close()


async def test_a_settlement_whose_commit_ack_is_lost_is_replayed_once(
        dropping: Dropping) -> None:
    """A settlement committed on the server whose answer was lost goes to the journal
    replay, which the store answers as a replay of the same settlement: the window holds
    it once, nothing pending."""
    p = await principal(PostgresKeyStore(dropping.pool),
                        limits=TeamLimits(usd_micros_per_day=10**9))
    store = PostgresGovernanceStore(dropping.pool)
    governor = Governor(store, replay_interval_s=0.2)
    await governor.start()
    try:
        [permit] = await store.admit([request(p, usd=1_000, rid="settle-lost")])
        assert isinstance(permit, Permit)
        dropping.drop_next_answer()
        await governor.settle(permit, settlement(permit.request, exact(10, 700)))
        assert await governor.caught_up(timeout_s=DEADLINE_S)
        assert not dropping.flag.exists()

        def replayed() -> bool:
            return governor.backlog == 0

        await _until(replayed, "the replay took the settlement")
        [(status, usd)] = dropping.rows(
            "SELECT status, usd_committed FROM permits WHERE id = %s::uuid", permit.id)
        assert (status, usd) == ("complete", 700)
        window = await store.counter(f"team:{p.team_id}:usd:day:2026-11-29")
        assert window is not None and (window["committed"], window["reserved"]) == (700, 0)
        again = await store.settle(permit.id, settlement(permit.request, exact(10, 700)))
        assert again.replay and again.usd_committed == 700
    finally:
        await governor.close()
        await store.close()


def _read_only(server_dsn: str, dsn: str, on: bool) -> None:
    dbname = conninfo_to_dict(dsn)["dbname"]
    stmt = ("ALTER DATABASE {} SET default_transaction_read_only = on" if on
            else "ALTER DATABASE {} RESET default_transaction_read_only")
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL(stmt).format(pgsql.Identifier(str(dbname))))
        # Sessions already open keep the old default: end them, as a demotion does.
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = %s AND pid <> pg_backend_pid()", (dbname,))


async def test_a_read_only_database_refuses_to_admit_and_serves_once_writable(
        pg_server_dsn: str, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database answering read-only (SQLSTATE 25006, a standby) refuses every
    admission with a 503 naming it and target_session_attrs, grants nothing, and the
    store admits again once it is writable."""
    monkeypatch.setenv("INFERPLANE_DATABASE_URL", pg_dsn)
    pool = open_pool(DatabaseSettings(pool_min_size=1, pool_max_size=3))
    await pool.open(wait=True)
    p = await principal(PostgresKeyStore(pool), limits=TeamLimits(usd_micros_per_day=10**6))
    store = PostgresGovernanceStore(pool)
    try:
        _read_only(pg_server_dsn, pg_dsn, True)
        for i in range(3):
            with pytest.raises(GovernanceUnavailable) as refused:
                await store.admit([request(p, rid=f"ro{i}")])
            assert refused.value.status == 503 and refused.value.retry_after
        assert "read-only" in refused.value.message
        assert "target_session_attrs=read-write" in refused.value.message
        _read_only(pg_server_dsn, pg_dsn, False)
        end = time.monotonic() + DEADLINE_S
        while True:
            try:
                [permit] = await store.admit([request(p, rid="rw")])
                break
            except GovernanceUnavailable:
                assert time.monotonic() < end, "never admitted again"
                await asyncio.sleep(0.2)
        assert isinstance(permit, Permit)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT request_id FROM permits").fetchall()
        assert rows == [("rw",)]
    finally:
        await store.close()
        await pool.close()
