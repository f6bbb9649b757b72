"""One deployment's health and load, from what this replica sees of it.

A failure (a retryable status, a connect error, a timeout) opens the deployment's circuit
for a cooldown: ``cooldown_s``, doubled for each further failure in a row, at most
``max_cooldown_s``, and never shorter than the upstream's ``retry-after``. Once the
cooldown is over the circuit is half-open: one request at a time probes it; a success
closes the circuit, a failure opens it again for the next, longer cooldown. Requests in
flight are counted from the moment one is sent until its attempt is settled; with
``max_inflight`` that is the deployment's headroom.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum


class State(Enum):
    USABLE = "usable"
    FULL = "full"
    """Healthy, but at its ``max_inflight``."""
    COOLING = "cooling"
    """Circuit open (or half-open with its one probe in flight)."""


@dataclass
class Health:
    failures: int = 0
    """Failures in a row (0: the circuit is closed)."""
    until: float = 0.0
    """Left out until this monotonic time."""
    inflight: int = 0
    probing: bool = False
    """The half-open circuit's one probe is in flight."""
    freed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set whenever a request leaves or the circuit closes (``preferAffinity`` waits)."""

    def state(self, now: float, max_inflight: int | None) -> State:
        if self.until > now or (self.failures and self.probing):
            return State.COOLING
        if max_inflight is not None and self.inflight >= max_inflight:
            return State.FULL
        return State.USABLE

    def enter(self, now: float) -> None:
        self.inflight += 1
        if self.failures and self.until <= now:
            self.probing = True

    def leave(self) -> None:
        self.inflight = max(0, self.inflight - 1)
        self._wake()

    def succeeded(self) -> None:
        self.failures = 0
        self.until = 0.0
        self.probing = False
        self._wake()

    def failed(self, now: float, *, cooldown_s: float, max_cooldown_s: float,
               retry_after_s: float | None) -> float:
        """Open the circuit; returns how long for."""
        self.failures += 1
        self.probing = False
        pause = min(max_cooldown_s, cooldown_s * float(1 << min(self.failures - 1, 16)))
        if retry_after_s is not None:
            pause = max(pause, min(retry_after_s, max_cooldown_s))
        self.until = max(self.until, now + pause)
        return pause

    def _wake(self) -> None:
        self.freed.set()
        self.freed = asyncio.Event()


def retry_after_s(headers: dict[str, str]) -> float | None:
    """The upstream's ``retry-after-ms`` / ``retry-after`` (seconds; an HTTP date is
    ignored: cooldown_s applies), or None."""
    ms = headers.get("retry-after-ms")
    try:
        if ms is not None:
            return max(0.0, float(ms) / 1000)
        value = headers.get("retry-after")
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None
