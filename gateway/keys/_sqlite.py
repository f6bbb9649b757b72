"""The local-profile key store: teams and keys in one SQLite file (single replica).

Keys are stored as their SHA-256 and a short display prefix, never as plaintext. Every
edit bumps the row's revision; revocation leaves a tombstone (``revoked_at``) so a
revoked key stays listed and can never be re-created with the same hash. Each store is
a single connection behind one lock, which is all a single replica needs: the request
path's short transactions run inline on the event loop when the file is free, the rest
(and anything that would wait) in the store's worker threads (:class:`SqliteBase`).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from gateway.errors import BadRequest, NotFound
from gateway.keys._limits import (
    KEY_LIMITS,
    TEAM_LIMITS,
    check_limits,
    check_new_team,
    check_revision,
)
from gateway.keys._model import KeyLimits, KeyRecord, Principal, Team, TeamLimits, new_key

T = TypeVar("T")
# Frozen structs, so one shared default instance is safe.
_NO_TEAM_LIMITS = TeamLimits()
_NO_KEY_LIMITS = KeyLimits()

_SCHEMA = """
CREATE TABLE IF NOT EXISTS teams (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    rpm INTEGER, tpm INTEGER, tokens_per_day INTEGER,
    usd_micros_per_day INTEGER, usd_micros_per_month INTEGER,
    budget_fit_floor INTEGER,
    region TEXT,
    guardrails TEXT NOT NULL DEFAULT '[]',
    revision INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS keys (
    id TEXT PRIMARY KEY,
    team_id TEXT NOT NULL REFERENCES teams(id),
    key_hash TEXT NOT NULL UNIQUE,
    display_prefix TEXT NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    user TEXT,
    allowed_models TEXT,
    rpm INTEGER, tpm INTEGER, usd_micros_per_day INTEGER, usd_micros_per_month INTEGER,
    expires_at TEXT,
    revoked_at TEXT,
    revision INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS keys_team ON keys(team_id);
"""


def connect(path: str) -> sqlite3.Connection:
    """A WAL-mode connection in autocommit mode (transactions are explicit BEGINs)."""
    if path != ":memory:":
        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(Path(path).expanduser()) if path != ":memory:" else path,
                           isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode loses no committed transaction on a process crash (only on an
    # OS crash/power loss, the last transactions may roll back), at a fraction of the cost.
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


_WORKERS = 4
_BUSY_MS = 30_000
"""How long a transaction in a worker thread waits for another process's write lock."""
_CHECKPOINT_S = 1.0
"""How often the WAL is checkpointed (off the event loop) while the store is written."""


class SqliteBase:
    """One SQLite connection behind a lock, used inline on the event loop for the
    request path's short transactions and by the store's own worker threads otherwise.

    The request path (key resolution, admission, settlement) runs its transactions
    inline (:meth:`_run` with ``inline=True``, or :meth:`_inline`, which the governance
    store's batcher uses to put the admissions and settlements pending at once in one
    transaction: ``gateway/governance/_localbatch.py``): a few statements on a WAL file with
    ``synchronous=NORMAL`` take tens of µs, far less than handing them to a thread and
    back (a thread hop, a loop wake-up and GIL hand-offs each way: measured, about a
    third of the gateway's CPU per request). Inline never waits: the connection's busy
    timeout is 0, so when another process holds the write lock (the CLI, the alert
    store), or a worker thread holds the connection, the transaction goes to a worker
    thread instead, which waits up to ``_BUSY_MS`` for the lock as before. The WAL is
    checkpointed by a worker thread on its own connection (``PASSIVE``: it never blocks
    a writer), not by whichever commit crosses the auto-checkpoint threshold, so no
    checkpoint ``fsync`` ever runs on the event loop.

    Durability (``synchronous=NORMAL`` in WAL mode, chosen): a process crash loses no
    committed transaction; an OS crash or power loss may roll back the last few — the
    per-replica journal (docs/settlement.md) still holds what those settlements were.

    The executor is the store's own (not the loop's shared default one), so a burst of
    slow transactions queues here instead of occupying every default worker thread.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._busy_ms = 0
        self._written = False
        self._checkpointer: asyncio.Task[None] | None = None

    def _schema(self) -> str:
        raise NotImplementedError

    async def open(self) -> None:
        def _open() -> None:
            conn = connect(self.path)
            conn.executescript(self._schema())
            if self.path != ":memory:":
                conn.execute("PRAGMA wal_autocheckpoint=0")  # see _checkpoint_every
            conn.execute("PRAGMA busy_timeout=0")
            self._conn = conn
        self._executor = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="sqlite-store")
        await asyncio.get_running_loop().run_in_executor(self._executor, _open)
        if self.path != ":memory:":
            self._checkpointer = asyncio.get_running_loop().create_task(
                self._checkpoint_every())

    async def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.cancel()
            await asyncio.gather(self._checkpointer, return_exceptions=True)
            self._checkpointer = None
        conn, self._conn = self._conn, None
        executor, self._executor = self._executor, None
        if executor is None:
            return
        if conn is not None:
            def _close() -> None:
                with self._lock:
                    if self.path != ":memory:":
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    conn.close()
            await asyncio.get_running_loop().run_in_executor(executor, _close)
        executor.shutdown(wait=False)

    async def _checkpoint_every(self) -> None:
        """Copy the WAL into the database file, off the event loop, once a second while
        the store is being written (the WAL restarts from its start afterwards)."""
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        # The checkpoint connection is opened, used and closed only under this lock, and
        # never opened once the store has closed: a cancelled await does not stop the
        # worker thread it waits for, and closing a sqlite3 connection another thread is
        # executing on crashes. (Opened by this task before its first sleep, a connection
        # still being opened in its thread when close() cancelled the task stayed open
        # after close() returned: under load the WAL file outlived close() in 8 of 200
        # runs, and a copy of the file taken then could not be opened in 1 of 300,
        # "database disk image is malformed".)
        in_use = threading.Lock()
        ckpt: sqlite3.Connection | None = None
        closed = False

        def _checkpoint() -> None:
            nonlocal ckpt
            with in_use:
                if closed:
                    return
                if ckpt is None:
                    ckpt = connect(self.path)
                ckpt.execute("PRAGMA wal_checkpoint(PASSIVE)")
        try:
            while True:
                await asyncio.sleep(_CHECKPOINT_S)
                if not self._written:
                    continue
                self._written = False
                try:
                    await loop.run_in_executor(self._executor, _checkpoint)
                except sqlite3.Error:
                    self._written = True  # try again next time
        finally:
            with in_use:  # waits for a checkpoint still running in its thread (short)
                closed = True
                if ckpt is not None:
                    ckpt.close()

    def _busy(self, conn: sqlite3.Connection, ms: int) -> None:
        if self._busy_ms != ms:
            conn.execute(f"PRAGMA busy_timeout={int(ms)}")
            self._busy_ms = ms

    def _tx(self, fn: Callable[[sqlite3.Connection], T], write: bool) -> T:
        """Run ``fn`` in one transaction. A write transaction starts with BEGIN IMMEDIATE,
        taking the file's write lock before its first read, so what it reads cannot change
        before it writes; a read transaction is a WAL snapshot that blocks no writer."""
        if self._conn is None:
            raise RuntimeError(f"store {self.path!r} is not open (call await open())")
        with self._lock:
            conn = self._conn
            if write:
                _begin_immediate(conn)  # busy timeout still 0: waits in short steps
            else:
                conn.execute("BEGIN")
            try:
                try:
                    self._busy(conn, _BUSY_MS)
                    result = fn(conn)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            finally:
                self._busy(conn, 0)
            self._written = self._written or write
            return result

    def _inline(self, fn: Callable[[sqlite3.Connection], T], write: bool) -> tuple[bool, T | None]:
        """Run ``fn`` in one transaction on the calling thread if that needs no wait:
        (True, result), or (False, None) when the connection or the file's write lock
        is busy (nothing was changed; the caller goes to a worker thread)."""
        conn = self._conn
        if conn is None or not self._lock.acquire(blocking=False):
            return False, None
        try:
            self._busy(conn, 0)
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.OperationalError:  # SQLITE_BUSY: another process writes
                return False, None
            try:
                result = fn(conn)
                conn.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if _is_busy(exc):  # rolled back whole: the worker thread runs it again
                    return False, None
                raise
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            self._written = self._written or write
            return True, result
        finally:
            self._lock.release()

    async def _run(self, fn: Callable[[sqlite3.Connection], T], *, write: bool = True,
                   inline: bool = False) -> T:
        """Run ``fn`` in one transaction: inline when asked and possible (see the class
        docstring), else in a worker thread."""
        if self._executor is None:
            raise RuntimeError(f"store {self.path!r} is not open (call await open())")
        if inline:
            done, result = self._inline(fn, write)
            if done:
                return result  # type: ignore[return-value]
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._tx, fn,
                                                                write)


def _begin_immediate(conn: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE`` on a connection whose busy timeout is 0, waiting for another
    process's write lock in steps of 0.1 ms, doubling up to 5 ms, for up to ``_BUSY_MS``.

    SQLite's own busy handler sleeps 1, 2, 5, 10, ... ms between tries: with several
    ``mayu serve`` workers on one file, whose transactions hold the lock for a fraction
    of a millisecond, a batch that found the lock held slept ten times longer than the
    wait it needed (``server.workers``, docs/deploy.md)."""
    deadline = time.monotonic() + _BUSY_MS / 1000
    delay = 0.0001
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.005)


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _ts(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise BadRequest("timestamps must be timezone-aware (UTC)")
    return value.astimezone(UTC).isoformat()


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _team(row: sqlite3.Row) -> Team:
    return Team(id=row["id"], name=row["name"],
                limits=TeamLimits(**{n: row[n] for n in TEAM_LIMITS}),
                revision=row["revision"], region=row["region"],
                guardrails=tuple(json.loads(row["guardrails"])),
                created_at=_dt(row["created_at"]))


def _key(row: sqlite3.Row) -> KeyRecord:
    models = row["allowed_models"]
    return KeyRecord(
        id=row["id"], team_id=row["team_id"], key_hash=row["key_hash"],
        display_prefix=row["display_prefix"], name=row["name"], user=row["user"],
        allowed_models=None if models is None else tuple(json.loads(models)),
        limits=KeyLimits(**{n: row[n] for n in KEY_LIMITS}),
        expires_at=_dt(row["expires_at"]), revoked_at=_dt(row["revoked_at"]),
        revision=row["revision"], created_at=_dt(row["created_at"]))


def _find_team(conn: sqlite3.Connection, name_or_id: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = conn.execute(
        "SELECT * FROM teams WHERE id = ? OR name = ? ORDER BY id = ? DESC LIMIT 1",
        (name_or_id, name_or_id, name_or_id)).fetchone()
    return row


class SqliteKeyStore(SqliteBase):
    """:class:`gateway.keys.KeyStore` on a SQLite file (the local profile)."""

    def __init__(self, path: str, *,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        super().__init__(path)
        self._clock = clock

    def _schema(self) -> str:
        return _SCHEMA

    async def open(self) -> None:
        await super().open()

        def _upgrade(conn: sqlite3.Connection) -> None:
            # Added after the first release: an older file gains it (NULL: refuse).
            have = {r["name"] for r in conn.execute("PRAGMA table_info(teams)")}
            if "budget_fit_floor" not in have:
                conn.execute("ALTER TABLE teams ADD COLUMN budget_fit_floor INTEGER")
        await self._run(_upgrade)

    async def resolve(self, key_hash: str) -> Principal | None:
        def _resolve(conn: sqlite3.Connection) -> Principal | None:
            row = conn.execute("SELECT * FROM keys WHERE key_hash = ?", (key_hash,)).fetchone()
            if row is None:
                return None
            key = _key(row)
            if key.revoked_at is not None:
                return None
            if key.expires_at is not None and key.expires_at <= self._clock():
                return None
            team = _team(conn.execute("SELECT * FROM teams WHERE id = ?",
                                      (key.team_id,)).fetchone())
            return Principal(key_id=key.id, key_prefix=key.display_prefix,
                             key_revision=key.revision, key_limits=key.limits,
                             allowed_models=key.allowed_models, team=team, user=key.user)
        return await self._run(_resolve, write=False, inline=True)

    async def create_team(self, *, name: str, limits: TeamLimits = _NO_TEAM_LIMITS,
                          region: str | None = None,
                          guardrails: tuple[str, ...] = ()) -> Team:
        check_new_team(name, limits)

        def _create(conn: sqlite3.Connection) -> Team:
            if _find_team(conn, name) is not None:
                raise BadRequest(f"team {name!r} already exists")
            team_id = "team_" + uuid.uuid4().hex[:16]
            conn.execute(
                "INSERT INTO teams (id, name, rpm, tpm, tokens_per_day, usd_micros_per_day,"
                " usd_micros_per_month, budget_fit_floor, region, guardrails, revision,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)",
                (team_id, name, *(getattr(limits, n) for n in TEAM_LIMITS), region,
                 json.dumps(list(guardrails)), _ts(self._clock())))
            return _team(conn.execute("SELECT * FROM teams WHERE id = ?",
                                      (team_id,)).fetchone())
        return await self._run(_create)

    async def update_team(self, name_or_id: str, *, limits: TeamLimits,
                          expected_revision: int | None = None) -> Team:
        """Replace a team's limits, bumping its revision (compared in the transaction)."""
        check_limits(limits, TEAM_LIMITS, "team limits")

        def _update(conn: sqlite3.Connection) -> Team:
            row = _find_team(conn, name_or_id)
            if row is None:
                raise NotFound(f"team {name_or_id!r} does not exist")
            check_revision(f"team {row['name']!r}", row["revision"], expected_revision)
            conn.execute(
                "UPDATE teams SET rpm = ?, tpm = ?, tokens_per_day = ?, usd_micros_per_day = ?,"
                " usd_micros_per_month = ?, budget_fit_floor = ?, revision = revision + 1"
                " WHERE id = ?",
                (*(getattr(limits, n) for n in TEAM_LIMITS), row["id"]))
            return _team(conn.execute("SELECT * FROM teams WHERE id = ?",
                                      (row["id"],)).fetchone())
        return await self._run(_update)

    async def get_team(self, name_or_id: str) -> Team | None:
        def _get(conn: sqlite3.Connection) -> Team | None:
            row = _find_team(conn, name_or_id)
            return None if row is None else _team(row)
        return await self._run(_get, write=False)

    async def list_teams(self) -> list[Team]:
        def _list(conn: sqlite3.Connection) -> list[Team]:
            return [_team(r) for r in conn.execute("SELECT * FROM teams ORDER BY name")]
        return await self._run(_list, write=False)

    async def create_key(self, *, team: str, name: str = "", user: str | None = None,
                         allowed_models: tuple[str, ...] | None = None,
                         limits: KeyLimits = _NO_KEY_LIMITS,
                         expires_at: datetime | None = None) -> tuple[str, KeyRecord]:
        check_limits(limits, KEY_LIMITS, "key limits")
        plaintext, key_hash, prefix = new_key()
        models = None if allowed_models is None else json.dumps(list(allowed_models))

        def _create(conn: sqlite3.Connection) -> KeyRecord:
            row = _find_team(conn, team)
            if row is None:
                raise NotFound(f"team {team!r} does not exist")
            key_id = "key_" + uuid.uuid4().hex[:16]
            conn.execute(
                "INSERT INTO keys (id, team_id, key_hash, display_prefix, name, user,"
                " allowed_models, rpm, tpm, usd_micros_per_day, usd_micros_per_month,"
                " expires_at, revoked_at, revision, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, 1, ?)",
                (key_id, row["id"], key_hash, prefix, name, user, models,
                 *(getattr(limits, n) for n in KEY_LIMITS), _ts(expires_at),
                 _ts(self._clock())))
            return _key(conn.execute("SELECT * FROM keys WHERE id = ?", (key_id,)).fetchone())
        return plaintext, await self._run(_create)

    async def get_key(self, key_id: str) -> KeyRecord | None:
        def _get(conn: sqlite3.Connection) -> KeyRecord | None:
            row = conn.execute("SELECT * FROM keys WHERE id = ?", (key_id,)).fetchone()
            return None if row is None else _key(row)
        return await self._run(_get, write=False)

    async def list_keys(self, *, team: str | None = None,
                        include_revoked: bool = False) -> list[KeyRecord]:
        def _list(conn: sqlite3.Connection) -> list[KeyRecord]:
            sql, args = "SELECT * FROM keys WHERE 1 = 1", []
            if team is not None:
                row = _find_team(conn, team)
                if row is None:
                    raise NotFound(f"team {team!r} does not exist")
                sql += " AND team_id = ?"
                args.append(row["id"])
            if not include_revoked:
                sql += " AND revoked_at IS NULL"
            return [_key(r) for r in conn.execute(sql + " ORDER BY created_at, id", args)]
        return await self._run(_list, write=False)

    async def revoke_key(self, key_id: str, *,
                         expected_revision: int | None = None) -> KeyRecord:
        def _revoke(conn: sqlite3.Connection) -> KeyRecord:
            row = conn.execute("SELECT * FROM keys WHERE id = ?", (key_id,)).fetchone()
            if row is None:
                raise NotFound(f"key {key_id!r} does not exist")
            check_revision(f"key {key_id!r}", row["revision"], expected_revision)
            if row["revoked_at"] is None:
                conn.execute("UPDATE keys SET revoked_at = ?, revision = revision + 1"
                             " WHERE id = ?", (_ts(self._clock()), key_id))
            return _key(conn.execute("SELECT * FROM keys WHERE id = ?", (key_id,)).fetchone())
        return await self._run(_revoke)

