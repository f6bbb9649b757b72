"""The per-replica settlement journal: admission, dispatch and observed outcome.

Each replica appends to its own file in its own data dir (an exclusive ``flock`` refuses
a second process on the same file). For every permit it writes, in order:

1. ``admit`` — the permit id and the AdmissionRequest, once the store granted it;
2. ``dispatch`` — before the first byte of the request is written upstream;
3. ``outcome`` — the :class:`Settlement` computed from what the wire said, before the
   store is asked to take it;
4. ``settled`` — once the store took it (or refused it for good).

So after a crash a replica restarted on its data dir knows, for each permit it left
open: never dispatched (→ cancelled: a proof, not a guess), outcome observed (→ settled
as observed), or dispatched without an outcome (→ uncertain: the bound becomes
liability). A settlement the store could not take stays here until it is replayed.

Durability (``server.journal_fsync``): records are written with ``O_APPEND`` in one
``write`` each, so a process crash (SIGKILL) loses nothing the kernel accepted. A machine
crash can lose what was not yet fsynced: with ``always`` every dispatch and outcome
record is fsynced before it is acted on (nothing is lost); with ``interval`` (default)
the file is fsynced every ``journal_fsync_interval_s``, so at most that much is lost —
and because a lost ``dispatch`` record would turn "dispatched" into "never dispatched",
a journal written under an earlier boot (``/proc/sys/kernel/random/boot_id`` changed)
with ``interval`` never proves non-dispatch: such permits settle uncertain.

The file is compacted (rewritten with only the open permits, atomically) at open and
whenever it grows past ``compact_bytes``.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from pathlib import Path
from typing import Any

import msgspec

from gateway.errors import ConfigError
from gateway.governance._model import (
    AdmissionRequest,
    Outcome,
    OutcomeKind,
    Permit,
    Settlement,
)

log = logging.getLogger("mayu.journal")

_COMPACT_BYTES = 32 * 1024 * 1024


def boot_id() -> str:
    """This machine's boot id (changes at every boot; "unknown" where unreadable)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


class JournalEntry(msgspec.Struct, kw_only=True):
    """One permit's journaled life so far."""

    permit_id: str
    request: AdmissionRequest
    boot: str
    synced: bool = False
    """Written with ``journal_fsync: always`` (its dispatch record cannot be lost)."""
    dispatched: bool = False
    settlement: Settlement | None = None


def recovered_outcome(entry: JournalEntry, boot: str) -> Outcome:
    """What a permit left open by a crashed run settles as, from its journal alone.

    Never dispatched → cancelled (a proof: the dispatch record is written before the
    first byte goes upstream) — unless the machine rebooted since and the journal was
    not fsynced on every record, when the record may be lost: uncertain. Dispatched
    without an observed outcome → uncertain (its bound becomes liability).
    """
    if entry.dispatched:
        return Outcome(kind=OutcomeKind.UNCERTAIN,
                       detail="replica restarted: dispatched, outcome not observed")
    if entry.boot == boot or entry.synced:
        return Outcome(kind=OutcomeKind.CANCELLED,
                       detail="replica restarted: never dispatched (journal)")
    return Outcome(kind=OutcomeKind.UNCERTAIN,
                   detail="machine restarted: the dispatch record may have been lost "
                          "(journal_fsync: interval)")


def read_journal(path: str | os.PathLike[str]) -> dict[str, JournalEntry]:
    """The permits a journal file leaves open (not ``settled``), in admission order.

    A torn last line (a crash mid-write) is ignored: its record was never acted on.
    """
    entries: dict[str, JournalEntry] = {}
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return entries
    for line in data.splitlines():
        try:
            rec = msgspec.json.decode(line)
        except msgspec.DecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        _apply(entries, rec)
    return entries


def _apply(entries: dict[str, JournalEntry], rec: dict[str, Any]) -> None:
    kind, pid = rec.get("t"), rec.get("p")
    if not isinstance(pid, str):
        return
    if kind == "admit":
        entries[pid] = JournalEntry(
            permit_id=pid, boot=str(rec.get("boot", "unknown")),
            synced=bool(rec.get("sync")), request=msgspec.convert(rec["r"], AdmissionRequest))
        return
    entry = entries.get(pid)
    if entry is None:
        return
    if kind == "dispatch":
        entry.dispatched = True
    elif kind == "outcome":
        entry.settlement = msgspec.convert(rec["s"], Settlement)
    elif kind == "settled":
        del entries[pid]


class Journal:
    """The append-only journal of one replica (see the module docstring)."""

    def __init__(self, path: str, *, fsync: str = "interval", fsync_interval_s: float = 1.0,
                 compact_bytes: int = _COMPACT_BYTES) -> None:
        self.path = path
        self.fsync_always = fsync == "always"
        self._interval = fsync_interval_s
        self._compact_bytes = compact_bytes
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._dirty = False
        self._size = 0
        self._syncer: asyncio.Task[None] | None = None
        self.boot = boot_id()
        self.open_entries: dict[str, JournalEntry] = {}
        """Permits admitted by this journal's replica and not yet settled."""

    # -- lifecycle -----------------------------------------------------------------------

    def open(self) -> dict[str, JournalEntry]:
        """Lock and read the file; returns the permits a previous run left open."""
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(lock_fd)
            raise ConfigError(f"server.journal_path: {self.path} is in use by another "
                              "process; every replica needs its own data dir") from exc
        self._lock_fd = lock_fd
        left = read_journal(self.path)
        self.open_entries = dict(left)
        self._rewrite()
        return left

    def start(self) -> None:
        """Start the interval fsync task (``interval`` policy)."""
        if not self.fsync_always and self._syncer is None:
            self._syncer = asyncio.get_running_loop().create_task(self._sync_every())

    async def close(self) -> None:
        if self._syncer is not None:
            self._syncer.cancel()
            await asyncio.gather(self._syncer, return_exceptions=True)
            self._syncer = None
        if self._fd is not None:
            self._sync()
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- records -------------------------------------------------------------------------

    def admitted(self, permit: Permit) -> None:
        self.open_entries[permit.id] = JournalEntry(permit_id=permit.id,
                                                    request=permit.request, boot=self.boot,
                                                    synced=self.fsync_always)
        self._write({"t": "admit", "p": permit.id, "boot": self.boot,
                     "sync": self.fsync_always, "r": permit.request})

    async def dispatching(self, permit_id: str) -> None:
        """Record that the request is about to leave; returns once it is durable enough."""
        entry = self.open_entries.get(permit_id)
        if entry is not None:
            entry.dispatched = True
        self._write({"t": "dispatch", "p": permit_id})
        if self.fsync_always:
            await asyncio.to_thread(self._sync)

    async def observed(self, permit_id: str, settlement: Settlement) -> None:
        entry = self.open_entries.get(permit_id)
        if entry is not None:
            entry.settlement = settlement
        self._write({"t": "outcome", "p": permit_id, "s": settlement})
        if self.fsync_always:
            await asyncio.to_thread(self._sync)

    def settled(self, permit_id: str) -> None:
        if self.open_entries.pop(permit_id, None) is None:
            return
        self._write({"t": "settled", "p": permit_id})
        if self._size > self._compact_bytes:
            self._rewrite()

    # -- file ----------------------------------------------------------------------------

    def _write(self, record: dict[str, Any]) -> None:
        if self._fd is None:
            return
        line = msgspec.json.encode(record) + b"\n"
        try:
            os.write(self._fd, line)
        except OSError as exc:  # a full disk must not fail the request; say it loudly
            log.error("journal write to %s failed: %s", self.path, exc)
            return
        self._size += len(line)
        self._dirty = True

    def _sync(self) -> None:
        if self._fd is not None and self._dirty:
            self._dirty = False
            os.fsync(self._fd)

    async def _sync_every(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await asyncio.to_thread(self._sync)
            except OSError as exc:
                log.error("journal fsync of %s failed: %s", self.path, exc)

    def _rewrite(self) -> None:
        """Atomically replace the file with records of the open permits only."""
        tmp = self.path + ".tmp"
        lines = []
        for e in self.open_entries.values():
            lines.append({"t": "admit", "p": e.permit_id, "boot": e.boot, "sync": e.synced,
                          "r": e.request})
            if e.dispatched:
                lines.append({"t": "dispatch", "p": e.permit_id})
            if e.settlement is not None:
                lines.append({"t": "outcome", "p": e.permit_id, "s": e.settlement})
        data = b"".join(msgspec.json.encode(rec) + b"\n" for rec in lines)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = len(data)
        self._dirty = False
