"""Stopping a policy source's background task (file polling, LISTEN/refresh).

Both live sources run one task between ``start()`` and ``stop()``; stopping must wait
for the task to finish unwinding, so no reload runs after ``stop()`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has finished; its cancellation is
    expected, so it is not re-raised here."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
