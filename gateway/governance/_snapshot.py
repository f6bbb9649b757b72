"""Local admission re-checks the key and team a request was authenticated as.

In the local profile the key store and the governance store normally share one SQLite
file (``<data_dir>/mayu.db``). When they do, admission reads the key and team rows
inside its own write transaction, exactly as the shared profile's SQL does: a key
revoked, expired, moved or edited (and a team edited) between authentication and
admission is refused with a retryable 503, never admitted under stale limits. With a
separate governance file there are no key rows to read and the check is skipped.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime

import sql
from gateway.governance._counterkey import CounterKey
from gateway.governance._model import AdmissionRequest, Refusal
from gateway.governance._refusal import refusal
from gateway.localdb import Statements

_SQL = Statements(sql.local_governance)


def has_key_tables(conn: sqlite3.Connection) -> bool:
    """Whether this file holds the key store's tables (once it does, it always will)."""
    found = _SQL["has_key_tables"].execute(conn).fetchone()
    return bool(found[0] == 2)


def _mismatch(counter: str) -> Refusal:
    # Worded by the same function as the shared store's snapshot_mismatch refusal.
    return refusal("snapshot_mismatch", counter)


def snapshot_refusal(conn: sqlite3.Connection, req: AdmissionRequest,
                     now: datetime) -> Refusal | None:
    """A 503 refusal if the key or team changed since ``req`` was planned, else None
    (in a file that holds the key tables: :func:`has_key_tables`)."""
    key = _SQL["snapshot_key"].execute_values(conn, req.key_id).fetchone()
    if (key is None or key["revoked_at"] is not None or key["team_id"] != req.team_id
            or key["revision"] != req.key_revision
            or (key["expires_at"] is not None
                and datetime.fromisoformat(key["expires_at"]) <= now)):
        return _mismatch(CounterKey.key(req.key_id).text)
    team = _SQL["snapshot_team"].execute_values(conn, req.team_id).fetchone()
    if team is None or team["revision"] != req.team_revision:
        return _mismatch(CounterKey.team(req.team_id).text)
    return None
