"""Console sessions: the rows a console sign-in leaves in the key store, and the calls
both stores answer about them (the local SQLite file and the shared Postgres database,
so a session made through one replica is read, and ended, through any other).

A row is keyed by the SHA-256 of the session id (the id itself is only in the visitor's
cookie) and names the credential it was made with by its SHA-256 too, never the
credential: ``subject`` (``admin:<token name>`` or ``key:<key id>``) and ``access``
(``write``, ``read`` or ``key``) say who it is. A session lives until ``expires_at``
(its absolute expiry), while it is used at least every ``idle_s`` seconds, and until it
is ended (``ended_at``: sign-out, or the credential behind it no longer standing).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

SessionAccess = Literal["write", "read", "key"]


@dataclass(frozen=True)
class ConsoleSession:
    """A live console session's row (its id is known only by its SHA-256)."""

    subject: str
    access: SessionAccess
    credential_sha256: bytes
    created_at: datetime
    expires_at: datetime


class ConsoleSessionStore(Protocol):
    """What the console asks of the key store about sessions."""

    async def create_console_session(self, *, id_sha256: bytes, subject: str,
                                     access: SessionAccess, credential_sha256: bytes,
                                     max_age_s: float) -> None:
        """Record a new session, expiring ``max_age_s`` from now (rows that expired a
        day ago are deleted meanwhile)."""

    async def console_session(self, id_sha256: bytes, *,
                              idle_s: float) -> ConsoleSession | None:
        """The session if it is live (not ended, not expired, used within ``idle_s``),
        its last use moved to now; else None."""

    async def end_console_session(self, id_sha256: bytes) -> None:
        """End one session (sign-out); ending an ended one changes nothing."""

    async def end_console_sessions(self, credential_sha256: bytes) -> int:
        """End every live session made with this credential; how many were live."""


PURGE_AFTER_S = 86_400
"""An expired session's row is kept this long (then deleted at the next sign-in)."""
