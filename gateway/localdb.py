"""The local profile's SQLite files: how one is opened, and the base class of its stores.

:func:`connect` opens a file as every store and its checkpointer do: WAL,
``synchronous=NORMAL``, foreign keys on, a 30 s busy timeout, rows as
:class:`sqlite3.Row`; the file (and with it the ``-wal`` and ``-shm`` files SQLite
creates beside it, which take its mode) is readable and writable by its owner only
(0600), like the journal and the audit log.

:class:`SqliteBase` is the one base class of the stores that keep their tables in such a
file (keys, governance, alerts, lease): one connection behind a lock, the store's own
worker threads, inline transactions for the request path, and a checkpointer. Each
store names its ``schema`` (the ``schema`` statements of its ``sql/local/<store>.sql``),
run when it opens. A file whose tables lack a column of that schema (created by a
pre-release build) is refused with a :class:`gateway.errors.ConfigError` naming the
table and the columns; no store alters a table in place.

:class:`Statements` gives a store the other named statements of its file, each a
:class:`Statement` run on a connection with its parameters taken from a mapping.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from operator import itemgetter
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from gateway.errors import ConfigError

T = TypeVar("T")

MEMORY = ":memory:"
FILE_MODE = 0o600
"""The mode of the database file, hence of its ``-wal`` and ``-shm`` files."""

_WORKERS = 4
_BUSY_MS = 30_000
"""How long a transaction in a worker thread waits for another process's write lock."""
_CHECKPOINT_S = 1.0
"""How often the WAL is checkpointed (off the event loop) while the store is written."""


def _narrow(path: Path) -> None:
    """Narrow the mode of the database file, its ``-wal`` and its ``-shm`` to
    :data:`FILE_MODE` where it is wider (files of this user only: another user's file is
    left as it is).

    By path, never through a file descriptor of our own: closing any descriptor of a file
    drops every POSIX lock this process holds on it, the locks by which SQLite's
    connections (the store's, the checkpointer's) tell another process that the file is
    in use."""
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            st = file.stat()
            mode = stat.S_IMODE(st.st_mode)
            if mode & ~FILE_MODE and st.st_uid == os.geteuid():
                os.chmod(file, mode & FILE_MODE)
        except OSError:  # not there (yet), or a read-only file system
            continue


def connect(path: str) -> sqlite3.Connection:
    """A WAL-mode connection in autocommit mode (transactions are explicit BEGINs).

    SQLite creates the database file when it opens it (with the umask's mode) and its
    ``-wal`` and ``-shm`` files at the first statement, with the database file's mode:
    the file is narrowed in between, so all three are private from their start."""
    file = None if path == MEMORY else Path(path).expanduser()
    if file is not None:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # owner only, as its files
    conn = sqlite3.connect(path if file is None else str(file), isolation_level=None,
                           check_same_thread=False, timeout=30.0)
    if file is not None:
        _narrow(file)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode loses no committed transaction on a process crash (only on an
    # OS crash/power loss, the last transactions may roll back), at a fraction of the cost.
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|:(\w+)")
"""A string literal, a quoted identifier, a comment (all kept as they are), or a
``:name`` parameter."""

Params = Mapping[str, Any]


def _getter(names: tuple[str, ...]) -> Callable[[Params], tuple[Any, ...]]:
    if not names:
        return lambda params: ()
    if len(names) == 1:
        name = names[0]
        return lambda params: (params[name],)
    return itemgetter(*names)


class Statement:
    """One named statement as sqlite3 runs it: each ``:name`` parameter numbered
    (``?1``, ``?2``… by first appearance, :attr:`names` in that order), bound from a tuple.

    :meth:`execute` takes the parameters as a mapping; the request path's statements
    take their values in the order of :attr:`names` (:meth:`execute_values`), checked
    once against the names the caller expects (:meth:`expect`). sqlite3 binds a mapping
    by name, making a str and looking it up for each parameter, and a mapping must be
    built first: an admission and its settlement (the local store, five counters) cost
    about a tenth more instructions through mappings than through tuples (callgrind,
    ``tests/bench/bench_local_store.py`` one at a time).
    """

    __slots__ = ("names", "text", "_args")

    def __init__(self, text: str) -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:
                return match.group(0)
            if name not in names:
                names.append(name)
            return f"?{names.index(name) + 1}"
        self.text = _TOKEN.sub(number, text)
        self.names = tuple(names)
        self._args = _getter(self.names)

    def expect(self, *names: str) -> Statement:
        """This statement, once its parameters are ``names`` in that order (ValueError
        otherwise): for a caller that passes their values in that order."""
        if names != self.names:
            raise ValueError(f"statement parameters are {self.names}, not {names}")
        return self

    def execute(self, conn: sqlite3.Connection, params: Params | None = None
                ) -> sqlite3.Cursor:
        return conn.execute(self.text, () if params is None else self._args(params))

    def executemany(self, conn: sqlite3.Connection, rows: Iterable[Params]) -> sqlite3.Cursor:
        return conn.executemany(self.text, map(self._args, rows))

    def execute_values(self, conn: sqlite3.Connection, *values: Any) -> sqlite3.Cursor:
        """Run with the values of :attr:`names`, in that order."""
        return conn.execute(self.text, values)

    def executemany_values(self, conn: sqlite3.Connection,
                           rows: Iterable[tuple[Any, ...]]) -> sqlite3.Cursor:
        """Run once per tuple of the values of :attr:`names`, in that order."""
        return conn.executemany(self.text, rows)


class _Named(Protocol):
    def __getitem__(self, name: str, /) -> str: ...


class Statements(dict[str, Statement]):
    """``statements["name"]``: the :class:`Statement` of one ``sql/local/<store>.sql``
    (``sql.local_keys`` …), made at its first use (a dict: looking one up again runs
    no Python code)."""

    def __init__(self, queries: _Named) -> None:
        super().__init__()
        self._queries = queries

    def __missing__(self, name: str) -> Statement:
        made = self[name] = Statement(self._queries[name])
        return made


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM pragma_table_info(?)", (table,))]


def check_columns(conn: sqlite3.Connection, schema: str, path: str) -> None:
    """Refuse (ConfigError) a file whose existing tables lack a column of ``schema``."""
    want = sqlite3.connect(MEMORY)
    try:
        want.executescript(schema)
        tables = [r[0] for r in want.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        stale = []
        for table in tables:
            have = _columns(conn, table)
            missing = [c for c in _columns(want, table) if c not in have]
            if have and missing:
                stale.append(f"table {table} has no {', '.join(missing)}")
    finally:
        want.close()
    if stale:
        raise ConfigError(f"{path}: created by a pre-release build of mayu "
                          f"({'; '.join(stale)}); this version does not convert it: move "
                          "it aside to start with a new file")


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
    thread instead, which waits up to ``_BUSY_MS`` for the lock. The WAL is
    checkpointed by a worker thread on its own connection (``PASSIVE``: it never blocks
    a writer), not by whichever commit crosses the auto-checkpoint threshold, so no
    checkpoint ``fsync`` ever runs on the event loop.

    Durability (``synchronous=NORMAL`` in WAL mode, chosen): a process crash loses no
    committed transaction; an OS crash or power loss may roll back the last few — the
    per-replica journal (docs/settlement.md) still holds what those settlements were.

    The executor is the store's own (not the loop's shared default one), so a burst of
    slow transactions queues here instead of occupying every default worker thread.
    """

    schema: ClassVar[str] = ""
    """The store's tables: the ``schema`` statements of its ``sql/local/<store>.sql``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._busy_ms = 0
        self._written = False
        self._checkpointer: asyncio.Task[None] | None = None

    def _connect(self) -> sqlite3.Connection:
        conn = connect(self.path)
        try:
            check_columns(conn, self.schema, self.path)
            conn.executescript(self.schema)
            if self.path != MEMORY:
                conn.execute("PRAGMA wal_autocheckpoint=0")  # see _checkpoint_every
            conn.execute("PRAGMA busy_timeout=0")
        except BaseException:
            conn.close()
            raise
        return conn

    async def open(self) -> None:
        """Open the file (created if missing) and create the store's tables."""
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="sqlite-store")
        try:
            self._conn = await loop.run_in_executor(executor, self._connect)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        self._executor = executor
        if self.path != MEMORY:
            self._checkpointer = loop.create_task(self._checkpoint_every())

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
                    if self.path != MEMORY:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    conn.close()
            await asyncio.get_running_loop().run_in_executor(executor, _close)
        executor.shutdown(wait=False)

    async def _checkpoint_every(self) -> None:
        """Copy the WAL into the database file, off the event loop, once a second while
        the store is being written (the WAL restarts from its start afterwards)."""
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        # The checkpoint connection is opened (at the first checkpoint), used and closed
        # only under this lock, and never opened once the store has closed: a cancelled
        # await does not stop the worker thread it waits for, and closing a sqlite3
        # connection another thread is executing on crashes. So the connection is closed
        # before close() returns even when close() cancels this task while the
        # connection is still being opened in its thread (one left open would keep the
        # WAL file, and a copy of the database file taken then could be unreadable).
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
    of a millisecond, a batch that finds the lock held would sleep ten times longer than
    the wait it needs (``server.workers``, docs/deploy.md)."""
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


__all__ = ["FILE_MODE", "MEMORY", "SqliteBase", "Statement", "Statements", "check_columns",
           "connect"]
