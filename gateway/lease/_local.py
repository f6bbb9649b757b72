"""The plane's lease bookkeeping in its SQLite file (``<data_dir>/mayu.db``).

Three small things kept and one read, on a connection of their own (WAL: reads never
block the store; the file is a :class:`gateway.localdb.SqliteBase`, its table and
statements ``sql/local/lease.sql``):

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

import json
import sqlite3
import uuid
from collections.abc import Iterable
from typing import Any, NamedTuple

import sql
from gateway.localdb import SqliteBase, Statements

_SQL = Statements(sql.local_lease)


class Figures(NamedTuple):
    committed: int
    liability: int
    reserved: int


class SavedPolicy(NamedTuple):
    namespace: str
    generation: int
    fingerprint: str
    documents: dict[str, Any]


class LeaseFile(SqliteBase):
    """The lease table of one plane's SQLite file."""

    schema = sql.local_lease["schema"]

    # Opened by the lease client only, with the plane's id, for its frame: never as a
    # plain SqliteBase, whose open() takes nothing and returns nothing.
    async def open(self, *, dataplane_id: str | None,  # type: ignore[override]
                   default_id: str) -> tuple[str, str]:
        """Open the file; (frame, plane id). The frame is created on first use; the id is
        ``dataplane_id`` when configured (and then kept), else the one kept, else
        ``default_id`` (then kept)."""
        await super().open()

        def _plane(conn: sqlite3.Connection) -> tuple[str, str]:
            _SQL["create_plane"].execute(conn, {"frame": uuid.uuid4().hex,
                                                "dataplane_id": dataplane_id or default_id})
            if dataplane_id:
                _SQL["set_dataplane_id"].execute(conn, {"dataplane_id": dataplane_id})
            row = _SQL["plane"].execute(conn).fetchone()
            return str(row["frame"]), str(row["dataplane_id"])
        return await self._run(_plane)

    async def saved_policy(self) -> SavedPolicy | None:
        def _get(conn: sqlite3.Connection) -> SavedPolicy | None:
            row = _SQL["saved_policy"].execute(conn).fetchone()
            if row is None or row["documents"] is None:
                return None
            return SavedPolicy(row["namespace"], int(row["generation"]), row["fingerprint"],
                               json.loads(row["documents"]))
        return await self._run(_get, write=False)

    async def save_policy(self, saved: SavedPolicy) -> None:
        def _put(conn: sqlite3.Connection) -> None:
            _SQL["save_policy"].execute(conn, {
                "namespace": saved.namespace, "generation": saved.generation,
                "fingerprint": saved.fingerprint,
                "documents": json.dumps(saved.documents, sort_keys=True)})
        await self._run(_put)

    async def figures(self, periods: Iterable[str]) -> dict[str, Figures]:
        """Every local ``account:`` counter of the given periods, by counter key."""
        suffixes = tuple(f":{p}" for p in periods)

        def _read(conn: sqlite3.Connection) -> dict[str, Figures]:
            try:
                rows = _SQL["account_figures"].execute(conn).fetchall()
            except sqlite3.OperationalError:  # no gov_counters: no counter to report
                return {}
            return {r["counter"]: Figures(max(0, r["committed"]), max(0, r["liability"]),
                                          max(0, r["reserved"]))
                    for r in rows if r["counter"].endswith(suffixes)}
        return await self._run(_read, write=False)
