"""Stopping a background task: cancel it and wait until it has unwound.

The gateway's background loops (pruning, heartbeats, credential refresh, policy reloads,
the metrics bridge) are stopped the same way: cancelled, then awaited, so that nothing of
theirs runs after their owner's ``stop()`` returns. Their cancellation is the expected
end, so it is not re-raised; any other exception the task ended with is.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to stop) and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
