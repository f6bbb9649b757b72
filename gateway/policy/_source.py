"""Where a gateway's policy snapshot comes from.

A source hands out the current :class:`PolicySnapshot` atomically (one attribute read),
so the router captures a generation together with the rules that belong to it. Sources:
a fixed snapshot (no policies), local files with hot reload (``policies:``), or the
shared Postgres generation (shared mode).
"""

from __future__ import annotations

from typing import Protocol

from gateway.policy._compiled import EMPTY_SNAPSHOT, PolicySnapshot


class PolicySource(Protocol):
    def snapshot(self) -> PolicySnapshot:
        """The current snapshot; never blocks, never partially updated."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class StaticPolicySource:
    """A snapshot that never changes (no policy source configured)."""

    def __init__(self, snapshot: PolicySnapshot = EMPTY_SNAPSHOT) -> None:
        self._snapshot = snapshot

    def snapshot(self) -> PolicySnapshot:
        return self._snapshot

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None
