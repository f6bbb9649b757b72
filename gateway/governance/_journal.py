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

A line that cannot be read (not JSON, torn by a machine crash, binary, or JSON of the
wrong shape) is skipped with one warning naming the file, the line number and what was
wrong (never the line itself: it may hold request details), and counted
(:attr:`Journal.rejected_lines`). Before the compaction at open drops such lines they are
appended, byte for byte, to ``<journal>.rejected`` (mode 0600, fsynced) so the evidence
for a permit they concerned is kept; the gateway starts with every permit whose lines
were readable. A permit whose ``admit`` line was unreadable stays pending in the store
(``mayu permits resolve`` settles it).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from dataclasses import dataclass, field
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


class _Admit(msgspec.Struct, tag_field="t", tag="admit"):
    p: str
    r: AdmissionRequest
    boot: str = "unknown"
    sync: bool = False


class _Dispatch(msgspec.Struct, tag_field="t", tag="dispatch"):
    p: str


class _Observed(msgspec.Struct, tag_field="t", tag="outcome"):
    p: str
    s: Settlement


class _Settled(msgspec.Struct, tag_field="t", tag="settled"):
    p: str


_decode_record = msgspec.json.Decoder(_Admit | _Dispatch | _Observed | _Settled).decode

_REASON_CHARS = 120
"""A rejection's reason is cut to this: msgspec may quote a value (``Invalid value
'…'``), and a log line must not carry a long piece of the journal."""


@dataclass(frozen=True)
class RejectedLine:
    """One journal line that could not be read: where, why, and its exact bytes."""

    number: int
    """1-based line number in the file as read."""
    reason: str
    """What was wrong (msgspec's message, cut short; never the line's content)."""
    raw: bytes = field(repr=False)
    permit_id: str | None = None
    """The record's permit id when the line is a JSON object with a plausible one."""


def _permit_id_of(line: bytes) -> str | None:
    """The ``p`` of an unreadable record, if it is JSON with an id-like ``p`` (letters,
    digits, ``-`` and ``_``, at most 64): an operator can then resolve that permit."""
    try:
        rec = msgspec.json.decode(line)
    except msgspec.DecodeError:
        return None
    pid = rec.get("p") if isinstance(rec, dict) else None
    if (isinstance(pid, str) and 0 < len(pid) <= 64
            and all(c.isascii() and (c.isalnum() or c in "-_") for c in pid)):
        return pid
    return None


@dataclass
class JournalScan:
    """A journal file as read: the permits it leaves open and the lines it could not."""

    entries: dict[str, JournalEntry] = field(default_factory=dict)
    rejected: list[RejectedLine] = field(default_factory=list)


def scan_journal(path: str | os.PathLike[str]) -> JournalScan:
    """Read a journal file (a missing one is empty) without raising on its content.

    A line that is not JSON or not one of the four record shapes is not applied: it is
    returned in :attr:`JournalScan.rejected` with its number and the reason. Permits
    whose lines were readable come out exactly as if the bad lines were absent.
    """
    scan = JournalScan()
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return scan
    # Split on b"\n" only (never \r): what a record cannot contain, so a rejected line
    # is kept byte for byte.
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            rec = _decode_record(line)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # (a ValidationError is a DecodeError too: test it first)
            what = "wrong shape" if isinstance(exc, msgspec.ValidationError) else "not JSON"
            reason = f"{what}: {exc}"
            if len(reason) > _REASON_CHARS:
                reason = reason[:_REASON_CHARS] + "…"
            scan.rejected.append(RejectedLine(number=number, reason=reason, raw=line,
                                              permit_id=_permit_id_of(line)))
            continue
        _apply(scan.entries, rec)
    return scan


def read_journal(path: str | os.PathLike[str]) -> dict[str, JournalEntry]:
    """The permits a journal file leaves open (not ``settled``), in admission order.

    An unreadable line (a torn last line after a crash, binary, or the wrong shape) is
    skipped with one warning each (:func:`log_rejected`); see :func:`scan_journal`.
    """
    scan = scan_journal(path)
    log_rejected(path, scan.rejected)
    return scan.entries


_LOGGED_PER_FILE = 20
"""Rejected lines logged one by one per file; the rest are summed up in one line."""


def log_rejected(path: str | os.PathLike[str], rejected: list[RejectedLine]) -> None:
    """One warning per unreadable line (the first ``_LOGGED_PER_FILE``, then one line for
    the rest): file, line number, what was wrong; never the line's bytes."""
    for line in rejected[:_LOGGED_PER_FILE]:
        log.warning("journal %s: line %d skipped%s (%s)", os.fspath(path), line.number,
                    f", permit {line.permit_id}" if line.permit_id else "", line.reason)
    if len(rejected) > _LOGGED_PER_FILE:
        log.warning("journal %s: %d more unreadable line(s) skipped (lines %d..%d)",
                    os.fspath(path), len(rejected) - _LOGGED_PER_FILE,
                    rejected[_LOGGED_PER_FILE].number, rejected[-1].number)


def _apply(entries: dict[str, JournalEntry],
           rec: _Admit | _Dispatch | _Observed | _Settled) -> None:
    if isinstance(rec, _Admit):
        entries[rec.p] = JournalEntry(permit_id=rec.p, boot=rec.boot, synced=rec.sync,
                                      request=rec.r)
        return
    entry = entries.get(rec.p)
    if entry is None:
        return
    if isinstance(rec, _Dispatch):
        entry.dispatched = True
    elif isinstance(rec, _Observed):
        entry.settlement = rec.s
    else:
        del entries[rec.p]


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
        self.rejected_lines = 0
        """Unreadable lines found at :meth:`open` (kept in :attr:`rejected_path`)."""

    @property
    def rejected_path(self) -> str:
        """The quarantine file: unreadable lines, appended before compaction drops them."""
        return self.path + ".rejected"

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
        scan = scan_journal(self.path)
        self.rejected_lines = len(scan.rejected)
        if scan.rejected:
            log_rejected(self.path, scan.rejected)
            self._quarantine(scan.rejected)  # before the rewrite drops them
        left = scan.entries
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

    def _quarantine(self, rejected: list[RejectedLine]) -> None:
        """Append the unreadable lines, byte for byte, to :attr:`rejected_path` and make
        them durable; an error propagates (the journal is then left as it was)."""
        data = b"".join(line.raw + b"\n" for line in rejected)
        fd = os.open(self.rejected_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        dir_fd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        try:  # the new file's directory entry, before the rewrite's rename
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        log.warning("journal %s: %d unreadable line(s) kept in %s before compaction",
                    self.path, len(rejected), self.rejected_path)

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
