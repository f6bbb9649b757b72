"""An append-only file fsynced by policy: what the audit file (:mod:`gateway.audit`) and
the governance journal (``gateway.governance``'s) have in common.

``always``: the owner fsyncs after the records that must not be lost (:meth:`_sync_now`).
``interval``: a task started with :meth:`AppendFile.start` fsyncs the file every
``fsync_interval_s`` when something was written since, on a duplicate descriptor (the
owner may close or replace its own meanwhile: a rotation); a failed fsync is logged and
retried at the next interval.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import ClassVar


class AppendFile:
    """The descriptor, size and fsync state of one append-only file."""

    what: ClassVar[str] = "file"
    """What the file is, in log lines (``audit``, ``journal``)."""
    logger: ClassVar[logging.Logger] = logging.getLogger(__name__)
    """Where a failed interval fsync is logged (the owner's own logger)."""

    def __init__(self, path: str, *, fsync: str, fsync_interval_s: float) -> None:
        self.path = path
        self.fsync_always = fsync == "always"
        self._interval = fsync_interval_s
        self._fd: int | None = None
        self._size = 0
        self._dirty = False
        """Written since the last fsync."""
        self._syncer: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the interval fsync (``interval`` policy); needs a running event loop."""
        if not self.fsync_always and self._syncer is None and self._fd is not None:
            self._syncer = asyncio.get_running_loop().create_task(self._sync_every())

    async def _stop_syncer(self) -> None:
        """Stop the interval fsync and wait for it (whatever it ended with)."""
        if self._syncer is not None:
            self._syncer.cancel()
            await asyncio.gather(self._syncer, return_exceptions=True)
            self._syncer = None

    def _close_fd(self) -> None:
        """Fsync what was written, then close the descriptor."""
        if self._fd is not None:
            self._sync_now()
            os.close(self._fd)
            self._fd = None

    def _sync_now(self) -> None:
        if self._fd is not None and self._dirty:
            self._dirty = False
            os.fsync(self._fd)

    async def _sync_every(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            if self._fd is None or not self._dirty:
                continue
            self._dirty = False
            # A duplicate descriptor: a rotation may close ours while the thread syncs.
            fd = os.dup(self._fd)
            try:
                await asyncio.to_thread(os.fsync, fd)
            except OSError as exc:
                self.logger.error("%s fsync of %s failed: %s", self.what, self.path, exc)
            finally:
                os.close(fd)
