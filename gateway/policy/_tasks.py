"""A policy source's background task (file polling, LISTEN/refresh).

Both live sources run one task between ``start()`` and ``stop()``; stopping must wait
for the task to finish unwinding, so no reload runs after ``stop()`` returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.tasks import cancel_and_wait


class BackgroundTask:
    """One named task: started at most once, stopped by cancelling it and waiting."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._task: asyncio.Task[None] | None = None

    def start(self, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``run()`` in the background, unless it already runs."""
        if self._task is None:
            self._task = asyncio.create_task(run(), name=self._name)

    async def stop(self) -> None:
        """Cancel the task (if any) and wait until it has finished; its cancellation is
        expected, so it is not re-raised here."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
