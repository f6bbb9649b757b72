"""The per-replica audit file: one JSON line per event, append-only, fsynced, rotated.

Each replica writes its own file (never shared between processes). A line records who
called, what was admitted, what happened upstream, how the permit was settled and what
it cost — lines are written at admission (``admitted``), before the first byte goes
upstream (``dispatch``), at settlement (``settled``, before the client sees the end of
its answer) and for refusals, budget alerts and replayed settlements.

Durability (``server.audit_fsync``, docs/deploy.md "Audit files"):

- every line is ONE ``write(2)`` on an ``O_APPEND`` descriptor, so a **process** crash
  (SIGKILL, OOM) loses nothing the kernel accepted, and no line is interleaved with
  another; a line is torn only if the process dies inside that ``write`` — possible for
  the last line of the file being written at that moment, never for an earlier one (the
  next start ends such a fragment with a newline, so it stays one unparseable line and
  the new run's lines are whole);
- ``interval`` (default): the file is fsynced every ``server.audit_fsync_interval_s``
  (default 1 s) when something was written: a **machine** crash loses at most that
  interval of lines;
- ``always``: every line is fsynced before :meth:`AuditLog.write` returns, so nothing a
  client was answered about is lost even by a machine crash (one fsync per line, on the
  event loop: see the measured cost in docs/deploy.md).

Rotation: when the file reaches ``server.audit_max_bytes`` it is renamed to
``<path>.1`` (``.1`` to ``.2`` and so on; ``server.audit_keep`` rotated files are kept,
the oldest is removed) and the path is reopened. A rename by someone else (logrotate
without ``copytruncate``) is noticed at the next line — the descriptor's inode no longer
is the path's — and the path is reopened, so lines go to the new file, never into a
renamed one for longer than that.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import msgspec

from gateway.appendfile import AppendFile

log = logging.getLogger("mayu.audit")

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_KEEP = 5


def default_audit_path(data_dir: str, replica_id: str | None) -> str:
    replica = replica_id or f"{socket.gethostname()}-{os.getpid()}"
    return str(Path(data_dir) / f"audit-{replica}.jsonl")


def rotated_paths(path: str, keep: int) -> list[str]:
    """The file and its rotated predecessors, newest first (``path``, ``path.1``, …)."""
    return [path] + [f"{path}.{i}" for i in range(1, keep + 1)]


class AuditLog(AppendFile):
    """One replica's audit file (see the module docstring for the durability bound)."""

    what = "audit"
    logger = log

    def __init__(self, path: str, *, fsync: Literal["always", "interval"] = "interval",
                 fsync_interval_s: float = 1.0, max_bytes: int = DEFAULT_MAX_BYTES,
                 keep: int = DEFAULT_KEEP) -> None:
        super().__init__(path, fsync=fsync, fsync_interval_s=fsync_interval_s)
        self._max_bytes = max_bytes
        self._keep = max(1, keep)
        self._ino: tuple[int, int] = (0, 0)
        self.rotations = 0
        """Rotations by size done by this process (tests, metrics)."""
        self.reopens = 0
        """Reopens after someone else renamed or removed the file."""

    # -- lifecycle -----------------------------------------------------------------------

    def open(self) -> None:
        # A folder it creates is its owner's only (0700), as the file in it (0600).
        Path(self.path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._reopen()
        self._end_torn_line()

    def _end_torn_line(self) -> None:
        """A previous run killed inside a write may have left a line without its
        newline: end it, so this run's first line is not glued to the fragment."""
        if self._fd is None or self._size == 0:
            return
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
        if last != b"\n":
            log.warning("audit file %s ended inside a line (a crash mid-write): the "
                        "fragment is kept as its own line", self.path)
            os.write(self._fd, b"\n")
            self._size += 1

    async def aclose(self) -> None:
        """Stop the interval fsync, then fsync and close the file."""
        await self._stop_syncer()
        self.close()

    def close(self) -> None:
        self._close_fd()

    # -- lines ---------------------------------------------------------------------------

    def write(self, record: dict[str, Any]) -> None:
        """Append one record; an audit failure is logged, never fails the request."""
        if self._fd is None:
            return
        line = msgspec.json.encode({"ts": datetime.now(UTC).isoformat(), **record}) + b"\n"
        try:
            self._follow_path()
            written = os.write(self._fd, line)
            if written < len(line):  # only on a full disk or quota: finish the line
                os.write(self._fd, line[written:])
            self._size += len(line)
            self._dirty = True
            if self.fsync_always:
                self._sync_now()
            if self._size >= self._max_bytes:
                self._rotate()
        except OSError as exc:
            log.error("audit write to %s failed: %s", self.path, exc)

    # -- file ----------------------------------------------------------------------------

    def _reopen(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        st = os.fstat(fd)
        old, self._fd = self._fd, fd
        self._ino, self._size = (st.st_dev, st.st_ino), st.st_size
        if old is not None:
            with contextlib.suppress(OSError):
                os.fsync(old)  # what went to the renamed file is durable too
            os.close(old)

    def _follow_path(self) -> None:
        """Reopen the path if it is no longer the file this descriptor writes (an
        external rename or removal, e.g. logrotate)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is None or (st.st_dev, st.st_ino) != self._ino:
            self.reopens += 1
            log.info("audit file %s was renamed or removed: reopening it", self.path)
            self._reopen()

    def _rotate(self) -> None:
        """``path`` → ``path.1`` (older ones shifted, ``keep`` kept), then reopen."""
        if self._fd is not None and os.fstat(self._fd).st_size < self._max_bytes:
            # Truncated under us (copytruncate): the file is smaller than we counted.
            self._size = os.fstat(self._fd).st_size
            return
        paths = rotated_paths(self.path, self._keep)
        for older, newer in zip(reversed(paths[1:]), reversed(paths[:-1]), strict=True):
            with contextlib.suppress(FileNotFoundError):
                os.replace(newer, older)  # the oldest (path.keep) is replaced: removed
        self._reopen()
        self.rotations += 1
        self._sync_dir()

    def _sync_dir(self) -> None:
        """Make the renames durable (a machine crash must not undo a rotation)."""
        try:
            dfd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)
