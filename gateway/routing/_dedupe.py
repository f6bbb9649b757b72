"""Identical-request dedupe: concurrent identical non-streamed requests of one team make one
upstream call (ADR-031's first job of the local cache).

The first request (the leader) goes upstream as any other; while it is in flight, an
identical one (same team, endpoint and body bytes — the body names the model) waits for
its answer instead, up to ``routing.dedupe_waiters`` of them. The leader's answer is kept
only in a :class:`VolatileStore` — memory, bounded in entries and bytes, dropped as soon
as the last waiter took it; nothing of it is written anywhere. A waiter whose leader did
not get a 2xx JSON answer goes upstream itself.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field

MAX_ENTRIES = 1024
MAX_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class Shared:
    """A leader's answer, as its waiters relay it."""

    request_id: str
    status: int
    headers: dict[str, str]
    content_type: str
    data: bytes


@dataclass
class _Flight:
    leader: str
    done: asyncio.Future[Shared | None]
    waiters: int = 0


class VolatileStore:
    """Payloads in memory only, at most ``max_entries`` and ``max_bytes`` at once."""

    def __init__(self, *, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._flights: dict[str, _Flight] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._flights)

    def get(self, key: str) -> _Flight | None:
        return self._flights.get(key)

    def open(self, key: str, leader: str) -> _Flight | None:
        if len(self._flights) >= self.max_entries:
            return None
        flight = self._flights[key] = _Flight(leader, asyncio.get_running_loop().create_future())
        return flight

    def fits(self, size: int) -> bool:
        return self.bytes + size <= self.max_bytes

    def close(self, key: str, flight: _Flight) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]


@dataclass
class Dedupe:
    """The flights of one replica, and how many answers were shared."""

    store: VolatileStore = field(default_factory=VolatileStore)
    shared: int = 0

    @staticmethod
    def key(team_id: str, endpoint: str, body: bytes) -> str:
        digest = hashlib.sha256(body)
        digest.update(f"\0{team_id}\0{endpoint}".encode())
        return digest.hexdigest()

    def follow(self, key: str, *, max_waiters: int) -> _Flight | None:
        """The flight to wait for, or None: lead (or no room to wait)."""
        flight = self.store.get(key)
        if flight is None or flight.waiters >= max_waiters or flight.done.done():
            return None
        flight.waiters += 1
        return flight

    def lead(self, key: str, request_id: str) -> _Flight | None:
        return self.store.open(key, request_id) if self.store.get(key) is None else None

    def land(self, key: str, flight: _Flight, shared: Shared | None) -> None:
        """The leader's answer (None: none to share) to its waiters; the payload is
        held only until they have it (the future), never stored beyond."""
        self.store.close(key, flight)
        if shared is not None and flight.waiters and self.store.fits(len(shared.data)):
            self.store.bytes += len(shared.data)
            self.shared += flight.waiters
            flight.done.set_result(shared)
            asyncio.get_running_loop().call_soon(self._release, len(shared.data))
        elif not flight.done.done():
            flight.done.set_result(None)

    def _release(self, size: int) -> None:
        self.store.bytes -= size
