"""A commit the synchronous standby never confirmed is not taken as stored.

A throwaway PostgreSQL whose ``synchronous_standby_names`` names a standby that never
connects: every commit is written on this server and then waits for that standby. When
the statement is cancelled in that wait (a client's cancel, ``pg_cancel_backend``; the
``statement_timeout`` is disarmed before the commit, so it never does),
PostgreSQL answers success with a WARNING ("canceling wait for synchronous replication
…: the transaction has already committed locally, but might not have been replicated
to the standby"). With a real standby a failover could lose such a commit, so the
gateway's database layer must not report it stored: it fails as a 503 that may have
committed (``gateway.db.maybe_committed``), which makes a settlement stay in the journal
for its (idempotent) replay and an admission's permit be refunded
(``test_failover_lost_ack.py`` covers those two paths).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.config import DatabaseSettings
from gateway.db import (
    DEADLINE_MARGIN_S,
    HeldConnections,
    Pool,
    connection,
    fetch_all,
    fetch_one,
    maybe_committed,
    open_pool,
)
from gateway.errors import GovernanceUnavailable
from tests._ha import pg_bindir
from tests.e2e._procs import free_port

pytestmark = pytest.mark.integration

DEADLINE_S = 30.0  # a hang guard, not a timing assertion


@pytest.fixture(scope="module")
def unconfirming_dsn() -> Iterator[str]:
    """A PostgreSQL server of its own (initdb in a throwaway directory; as the
    ``postgres`` OS user when we are root) whose synchronous standby never comes."""
    bindir = pg_bindir()
    root = Path(tempfile.mkdtemp(prefix="inferplane-syncrep."))
    os.chmod(root, 0o755)
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_pg:
        subprocess.run(["chown", "postgres", str(root)], check=True)
    data, port = root / "data", free_port()
    subprocess.run([*as_pg, f"{bindir}/initdb", "-D", str(data), "-U", "postgres",
                    "--auth", "trust", "-E", "UTF8"], check=True, capture_output=True)
    with (root / "log").open("wb") as log:
        proc = subprocess.Popen(
            [*as_pg, f"{bindir}/postgres", "-D", str(data), "-p", str(port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={root}",
             "-c", "synchronous_standby_names=nobody", "-c", "fsync=off"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        end = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(dsn, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                assert proc.poll() is None and time.monotonic() < end, (
                    root / "log").read_text(errors="replace")
                time.sleep(0.1)
        yield dsn
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def pool(unconfirming_dsn: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Pool]:
    """The gateway's pool on that server."""
    monkeypatch.setenv("INFERPLANE_DATABASE_URL", unconfirming_dsn)
    pool = open_pool(DatabaseSettings(pool_min_size=1, pool_max_size=2,
                                      pool_timeout_s=5.0))
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()


def _cancel_in_its_wait(dsn: str, pid: int) -> None:
    """Cancel backend ``pid`` once its commit waits for the standby (as a client's
    cancel or an operator's ``pg_cancel_backend`` does; the statement timeout does not
    reach a commit's wait)."""
    end = time.monotonic() + DEADLINE_S
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s AND "
                               "wait_event = 'SyncRep'", (pid,)).fetchall():
            assert time.monotonic() < end, "the commit never waited for the standby"
            time.sleep(0.02)
        conn.execute("SELECT pg_cancel_backend(%s)", (pid,))


async def _unconfirmed(conn: psycopg.AsyncConnection[Any], dsn: str, statement: str) -> None:
    """Run ``statement`` on ``conn``, cancelled while its commit waits: PostgreSQL answers
    success (with the WARNING)."""
    task = asyncio.ensure_future(conn.execute(statement))
    await asyncio.to_thread(_cancel_in_its_wait, dsn, conn.info.backend_pid)
    await task


async def _count(pool: Pool, table: str) -> int:
    async with connection(pool) as conn:
        cur = await conn.execute(f"SELECT count(*) FROM {table}")  # a read: no commit wait
        row = await cur.fetchone()
    assert row is not None
    return int(row["count"])  # the pool's rows are dicts


async def test_a_commit_the_standby_never_confirmed_fails_as_maybe_committed(
        pool: Pool, unconfirming_dsn: str) -> None:
    """A pooled call whose commit was cancelled while waiting for the standby fails
    (503, maybe committed) although PostgreSQL answered success; it did commit on the
    primary, and the connection serves the next call."""
    with pytest.raises(GovernanceUnavailable) as first:
        async with connection(pool) as conn:
            await _unconfirmed(conn, unconfirming_dsn, "CREATE TABLE unconfirmed (x int)")
    assert maybe_committed(first.value)
    assert "stopped waiting for its synchronous standby" in str(first.value)
    assert await _count(pool, "unconfirmed") == 0  # committed locally all the same


async def test_a_held_connection_reports_it_too_then_serves_again(
        pool: Pool, unconfirming_dsn: str) -> None:
    """The admission and settlement calls' kept connections (HeldConnections) report an
    unconfirmed commit the same way, and the warning is not carried to the next call."""
    with contextlib.suppress(GovernanceUnavailable):  # unconfirmed, committed
        async with connection(pool) as conn:
            await _unconfirmed(conn, unconfirming_dsn, "CREATE TABLE held (x int)")
    held = HeldConnections(pool, keep=1)
    try:
        with pytest.raises(GovernanceUnavailable) as lost:
            async with held.connection() as conn:
                await _unconfirmed(conn, unconfirming_dsn, "INSERT INTO held VALUES (1)")
        assert maybe_committed(lost.value)
        async with held.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM held")
            assert await cur.fetchone() == {"count": 1}
    finally:
        await held.close()


async def test_a_stalled_standby_holds_no_call_past_its_client_side_deadline(
        unconfirming_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL disarms ``statement_timeout`` before a commit, so with a synchronous
    standby that never answers nothing on the server ends a commit's wait. The pool's
    calls (``fetch_one`` / ``fetch_all``, every store call) bound it themselves:
    statement timeout + ``DEADLINE_MARGIN_S``, then the statement is cancelled and the
    call fails as a 503 that may have committed (it did, locally); the connection serves
    the next call and does not report the warning again."""
    monkeypatch.setenv("INFERPLANE_DATABASE_URL", unconfirming_dsn)
    pool = open_pool(DatabaseSettings(pool_min_size=1, pool_max_size=2, pool_timeout_s=5.0,
                                      statement_timeout_s=0.5))
    await pool.open(wait=True)
    try:
        with contextlib.suppress(GovernanceUnavailable):  # the table's own commit waits too
            async with connection(pool) as conn:
                await fetch_one(conn, "CREATE TABLE stalled (x int)")
        held = HeldConnections(pool, keep=1)
        try:
            t0 = time.monotonic()
            with pytest.raises(GovernanceUnavailable) as stalled:
                async with held.connection() as conn:
                    await fetch_one(conn, "INSERT INTO stalled VALUES (1) RETURNING x")
            waited = time.monotonic() - t0
            print(f"a commit waiting for the stalled standby failed after {waited:.2f} s "
                  f"(statement timeout 0.5 s + margin {DEADLINE_MARGIN_S:g} s)")
            assert 0.5 + DEADLINE_MARGIN_S - 0.1 <= waited < 8.0, waited
            assert maybe_committed(stalled.value)
            assert "may have committed" in str(stalled.value)
            async with held.connection() as conn:  # a read: no commit wait, no stale flag
                assert await fetch_all(conn, "SELECT x FROM stalled") == [{"x": 1}]
        finally:
            await held.close()
    finally:
        await pool.close()
