"""One deployment's health and load, from what this replica sees of it.

A failure (a retryable status, a connect error, a timeout) opens the deployment's circuit
for a cooldown: ``cooldown_s``, doubled for each further failure in a row, at most
``max_cooldown_s``, and never shorter than the upstream's ``retry-after``. Once the
cooldown is over the circuit is half-open: one request at a time probes it; a success
closes the circuit, a failure opens it again for the next, longer cooldown. Requests in
flight are counted from the moment one is sent until its attempt is settled; with
``max_inflight`` that is the deployment's headroom. An answer whose rate-limit headers
say a limit has nothing left (``x-ratelimit-remaining-*`` / ``anthropic-ratelimit-*-
remaining`` at 0) makes the deployment full until that limit resets: not a failure, but
new requests go to the others first.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
    exhausted_until: float = 0.0
    """Full until this monotonic time: the upstream said a rate limit has nothing left."""

    def state(self, now: float, max_inflight: int | None) -> State:
        if self.until > now or (self.failures and self.probing):
            return State.COOLING
        if self.exhausted_until > now:
            return State.FULL
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


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_LIMITS = (("x-ratelimit-remaining-{}", "x-ratelimit-reset-{}", ("requests", "tokens")),
           ("anthropic-ratelimit-{}-remaining", "anthropic-ratelimit-{}-reset",
            ("requests", "tokens", "input-tokens", "output-tokens")))


def _reset_s(value: str, now: datetime) -> float | None:
    """A reset as OpenAI (``6m0s``, ``20ms``) or Anthropic (RFC 3339) writes it, in
    seconds from ``now``; None when it is neither."""
    parts = _DURATION.findall(value)
    if parts and "".join(n + u for n, u in parts) == value.strip():
        return sum(float(n) * _UNIT_S[u] for n, u in parts)
    try:
        at = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None:
        return None
    return max(0.0, (at - now).total_seconds())


def exhausted_s(ratelimit: dict[str, str], now: datetime | None = None) -> float | None:
    """How long a deployment has no headroom, from its answer's rate-limit headers: the
    latest reset of a limit whose remaining is 0 (1 s when that reset is unreadable);
    None when every limit it reports has some left (or it reports none)."""
    if not ratelimit:
        return None
    now = now or datetime.now(UTC)
    longest: float | None = None
    for remaining, reset, dimensions in _LIMITS:
        for dim in dimensions:
            left = ratelimit.get(remaining.format(dim))
            if left is None or left.strip() != "0":
                continue
            value = ratelimit.get(reset.format(dim))
            pause = _reset_s(value, now) if value is not None else None
            pause = 1.0 if pause is None else pause
            longest = pause if longest is None else max(longest, pause)
    return longest
