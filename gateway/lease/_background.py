"""The background task a lease plane runs against inferplaned (the heartbeat, the usage
shipper): started once, and stopped by cancelling it and waiting for it to unwind before
its HTTP client is closed, so no request is left half-sent on a closed client."""

from __future__ import annotations

import asyncio

import httpx

from gateway.tasks import cancel_and_wait


class Background:
    """A task running :meth:`_loop` and the HTTP client it talks through."""

    _task: asyncio.Task[None] | None
    _http: httpx.AsyncClient | None

    async def _loop(self) -> None:
        raise NotImplementedError

    def _start_loop(self, name: str) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=name)

    async def _stop_loop(self) -> None:
        """Cancel the task, wait until it has ended, then close the client."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self._http is not None:
            await self._http.aclose()
            self._http = None


class Retry:
    """A loop's current run of failed tries and the wait before its next try: doubled on
    each failure, from ``floor`` up to ``ceiling``; none after a success."""

    def __init__(self, *, floor: float, ceiling: float) -> None:
        self._floor, self._ceiling = floor, ceiling
        self.failing = 0
        self.wait = 0.0

    def failed(self) -> float:
        """Count a failure; the wait before the next try."""
        self.failing += 1
        self.wait = min(self._ceiling, max(self._floor, self.wait * 2))
        return self.wait

    def succeeded(self) -> int:
        """End the run of failures; how many tries it had (0: none)."""
        failed, self.failing, self.wait = self.failing, 0, 0.0
        return failed
