"""The plane's lease bookkeeping in its own SQLite file (``<data_dir>/mayu.db``).

Three small things, on a connection of their own (WAL: reads never block the store):

- the **frame**: a random id created with the counter store and kept in the same file,
  so a plane that comes back with fresh counters (a new file, a wiped data dir) reports
  a new frame and the ledger adopts its counters instead of trusting the old figures;
- the plane's **id** when none is configured: chosen once (replica id or host name) and
  kept with the counters, so a pod that comes back under a new name on the same data
  dir keeps its ledger rows (a new id would count its cumulative figures twice);
- the **last applied policy set** (documents, generation, fingerprint, namespace), so a
  restart during a control-plane outage enforces what was published (ADR-034 §5);
- the **figures** of the local ``account:`` counters, read for each heartbeat.

Leases are not persisted: they are monotonic-clock promises of a running process, so a
restarted plane gates its FailClosed hard caps until its first answer (sent at once).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS lease_plane (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    frame TEXT NOT NULL,
    dataplane_id TEXT NOT NULL,
    namespace TEXT, generation INTEGER, fingerprint TEXT,
    documents TEXT,                          -- the last applied set, JSON {name: document}
    saved_at TEXT
);
"""


class Figures(NamedTuple):
    committed: int
    liability: int
    reserved: int


class SavedPolicy(NamedTuple):
    namespace: str
    generation: int
    fingerprint: str
    documents: dict[str, Any]


class LeaseFile:
    """The lease tables of one plane's SQLite file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._liability = False

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            raise RuntimeError(f"lease file {self.path!r} is not open")
        with self._lock:
            return fn(self._conn)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.to_thread(self._call, fn)

    async def open(self, *, dataplane_id: str | None, default_id: str) -> tuple[str, str]:
        """Open the file; (frame, plane id). The frame is created on first use; the id is
        ``dataplane_id`` when configured (and then kept), else the one kept, else
        ``default_id`` (then kept)."""
        def _open() -> tuple[str, str]:
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(Path(self.path).expanduser()), isolation_level=None,
                                   check_same_thread=False, timeout=30.0)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
            conn.execute("INSERT OR IGNORE INTO lease_plane (singleton, frame, dataplane_id)"
                         " VALUES (1, ?, ?)", (uuid.uuid4().hex, dataplane_id or default_id))
            if dataplane_id:
                conn.execute("UPDATE lease_plane SET dataplane_id = ?", (dataplane_id,))
            columns = {r[1] for r in conn.execute("PRAGMA table_info(gov_counters)")}
            self._liability = "liability" in columns
            self._conn = conn
            row = conn.execute("SELECT frame, dataplane_id FROM lease_plane").fetchone()
            return str(row[0]), str(row[1])
        return await asyncio.to_thread(_open)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.to_thread(conn.close)

    async def saved_policy(self) -> SavedPolicy | None:
        def _get(conn: sqlite3.Connection) -> SavedPolicy | None:
            row = conn.execute("SELECT namespace, generation, fingerprint, documents"
                               " FROM lease_plane").fetchone()
            if row is None or row[3] is None:
                return None
            return SavedPolicy(row[0], int(row[1]), row[2], json.loads(row[3]))
        return await self._run(_get)

    async def save_policy(self, saved: SavedPolicy) -> None:
        def _put(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE lease_plane SET namespace = ?, generation = ?,"
                         " fingerprint = ?, documents = ?, saved_at = datetime('now')",
                         (saved.namespace, saved.generation, saved.fingerprint,
                          json.dumps(saved.documents, sort_keys=True)))
        await self._run(_put)

    async def figures(self, periods: Iterable[str]) -> dict[str, Figures]:
        """Every local ``account:`` counter of the given periods, by counter key."""
        suffixes = tuple(f":{p}" for p in periods)
        liability = "liability" if self._liability else "0"

        def _read(conn: sqlite3.Connection) -> dict[str, Figures]:
            try:
                rows = conn.execute(f"SELECT counter, committed, {liability}, reserved"
                                    " FROM gov_counters WHERE kind = 'account'").fetchall()
            except sqlite3.OperationalError:  # no counter charged yet in a new file
                return {}
            return {r[0]: Figures(max(0, r[1]), max(0, r[2]), max(0, r[3]))
                    for r in rows if r[0].endswith(suffixes)}
        return await self._run(_read)
