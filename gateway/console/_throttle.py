"""How many failed sign-ins a client address may make: a sliding window per address.

One process's count (each worker or replica counts its own): ``failures`` refusals
within ``window_s`` seconds, then every sign-in from that address is refused until the
oldest of them leaves the window. The address is the client's as the server saw it,
or as a trusted proxy reported it (``server.trusted_proxies``). Memory is bounded: at
most ``failures`` instants per address and ``max_addresses`` addresses (the least
recently refused is forgotten first).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable


class SignInThrottle:
    """Failed sign-ins per client address within a sliding window."""

    def __init__(self, *, failures: int, window_s: float, max_addresses: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._failures = failures
        self._window_s = window_s
        self._max = max_addresses
        self._clock = clock
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str, now: float) -> deque[float]:
        times = self._seen.get(address, deque())
        while times and times[0] <= now - self._window_s:
            times.popleft()
        return times

    def retry_after(self, address: str) -> int | None:
        """Whole seconds until ``address`` may try again, or None when it may now."""
        now = self._clock()
        times = self._recent(address, now)
        if len(times) < self._failures:
            return None
        return max(1, math.ceil(times[0] + self._window_s - now))

    def failed(self, address: str) -> int:
        """Count a refusal from ``address``; how many it has within the window now."""
        now = self._clock()
        times = self._recent(address, now)
        times.append(now)
        while len(times) > self._failures:
            times.popleft()
        self._seen[address] = times
        self._seen.move_to_end(address)
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)
        return len(times)
