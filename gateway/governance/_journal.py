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

A line that cannot be read (not JSON, torn by a machine crash, binary, JSON of the
wrong shape, or a record the replay could not turn into a settlement a store takes) is
skipped with one warning naming the file, the line number and what was wrong (never the
line itself: it may hold request details), and counted (:attr:`Journal.rejected_lines`).
An open permit such a line may concern is never proven non-dispatched (the line may have
been its ``dispatch`` record): it settles uncertain, the reason in its settlement's detail
(:attr:`JournalEntry.damaged`). Before the compaction at open drops the bad lines they
are appended, byte for byte and each after a header with its line number, reason and
permit id, to ``<journal>.rejected`` (mode 0600, fsynced; :func:`read_quarantine`), so
the evidence is kept; that file is rotated at ``REJECTED_MAX_BYTES`` with
``REJECTED_KEEP`` older copies, so it stays bounded. The gateway starts with every permit
whose lines were readable. A permit whose ``admit`` line was unreadable stays pending in
the store: ``mayu permits list`` shows it with the quarantined line's reason, and
``mayu permits resolve`` settles it.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from gateway.appendfile import AppendFile
from gateway.ceilings import MAX_AMOUNT
from gateway.errors import BadRequest, ConfigError
from gateway.governance._model import (
    AdmissionRequest,
    Outcome,
    OutcomeKind,
    Permit,
    Settlement,
)
from gateway.governance._plan import check_settlement, validate_request
from gateway.pricing import InvalidUsage

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
    damaged: str = ""
    """Why a line of the journal this permit was read from may have been its own and
    could not be read (empty: none): it is then never proven non-dispatched."""


def recovered_outcome(entry: JournalEntry, boot: str) -> Outcome:
    """What a permit left open by a crashed run settles as, from its journal alone.

    Never dispatched → cancelled (a proof: the dispatch record is written before the
    first byte goes upstream) — unless the machine rebooted since and the journal was
    not fsynced on every record, when the record may be lost, or an unreadable line may
    have been it (:attr:`JournalEntry.damaged`): uncertain, with the reason. Dispatched
    without an observed outcome → uncertain (its bound becomes liability).
    """
    if entry.dispatched:
        damaged = f"; {entry.damaged}" if entry.damaged else ""
        return Outcome(kind=OutcomeKind.UNCERTAIN,
                       detail=f"replica restarted: dispatched, outcome not observed{damaged}")
    if entry.damaged:
        return Outcome(kind=OutcomeKind.UNCERTAIN,
                       detail=f"replica restarted: {entry.damaged}; it may have been "
                              "this permit's dispatch record")
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
    damaged: str = ""
    """Carried over by a compaction (:attr:`JournalEntry.damaged`), so a crash right
    after it cannot turn the permit back into a proven non-dispatch."""


class _Dispatch(msgspec.Struct, tag_field="t", tag="dispatch"):
    p: str


class _Observed(msgspec.Struct, tag_field="t", tag="outcome"):
    p: str
    s: Settlement


class _Settled(msgspec.Struct, tag_field="t", tag="settled"):
    p: str


_decode_record = msgspec.json.Decoder(_Admit | _Dispatch | _Observed | _Settled).decode
_decode_any = msgspec.json.decode

_REASON_CHARS = 120
"""A rejection's reason is cut to this: msgspec may quote a value (``Invalid value
'…'``), and a log line must not carry a long piece of the journal."""

_MAX_INT64 = (1 << 63) - 1
_KINDS = ("admit", "dispatch", "outcome", "settled")
# How a record starts as this module writes it (msgspec keeps the dict's key order): a
# torn line still names its kind and permit when it was cut after the id's closing quote.
_TORN_PREFIX = re.compile(rb'\{"t":"(admit|dispatch|outcome|settled)","p":"([A-Za-z0-9_-]{1,64})"')


@dataclass(frozen=True)
class RejectedLine:
    """One journal line that could not be read: where, why, and its exact bytes."""

    number: int
    """1-based line number in the journal file it was read from."""
    reason: str
    """What was wrong (msgspec's message or the failed check, cut short; never the
    line's content)."""
    raw: bytes = field(repr=False)
    permit_id: str | None = None
    """The record's permit id when it can be recovered (a JSON object with an id-like
    ``p``, or a torn line cut after the id)."""
    record: str | None = None
    """The record's kind (``admit``, ``dispatch``, ``outcome``, ``settled``) when it can
    be recovered the same way."""
    at: str | None = None
    """When it was quarantined (UTC, ISO 8601), for a line read back from
    ``<journal>.rejected``."""


class _Unconvertible(Exception):
    """A record that decodes but cannot be replayed (the message says why)."""


def _is_permit_id(value: object) -> bool:
    return (isinstance(value, str) and 0 < len(value) <= 64
            and all(c.isascii() and (c.isalnum() or c in "-_") for c in value))


def _identify(line: bytes) -> tuple[str | None, str | None]:
    """(kind, permit id) of an unreadable line, each when it can be recovered: from the
    JSON object it still is, or from the start of a torn one."""
    try:
        rec = _decode_any(line)
    except (msgspec.DecodeError, RecursionError):
        match = _TORN_PREFIX.match(line)
        if match is None:
            return None, None
        return match.group(1).decode(), match.group(2).decode()
    if not isinstance(rec, dict):
        return None, None
    kind, pid = rec.get("t"), rec.get("p")
    return (kind if kind in _KINDS else None,
            pid if _is_permit_id(pid) else None)


def _check_int(where: str, value: int, high: int) -> None:
    if not 0 <= value <= high:
        raise _Unconvertible(f"{where}: must be in 0..{high}")


def _check_request(r: AdmissionRequest) -> None:
    """What the replay computes from an admission request must be a settlement a store
    can take: figures within the planner's ceilings (:func:`validate_request`)."""
    _check_int("r.token_bound", r.token_bound, MAX_AMOUNT)
    _check_int("r.usd_bound", r.usd_bound, MAX_AMOUNT)
    for name in ("key_revision", "team_revision", "policy_generation"):
        _check_int(f"r.{name}", getattr(r, name), _MAX_INT64)
    try:
        validate_request(r)
    except BadRequest as exc:
        raise _Unconvertible(f"r.{exc.message}") from None


def _convert(entries: dict[str, JournalEntry],
             rec: _Admit | _Dispatch | _Observed | _Settled) -> None:
    """Apply one decoded record, or raise :class:`_Unconvertible` (nothing applied)."""
    if not _is_permit_id(rec.p):
        raise _Unconvertible("p: not a permit id")
    if isinstance(rec, _Admit):
        if rec.p in entries:  # never written twice: replacing it would drop its dispatch
            raise _Unconvertible("p: a second admit of a permit already open")
        _check_request(rec.r)
        entries[rec.p] = JournalEntry(permit_id=rec.p, boot=rec.boot, synced=rec.sync,
                                      request=rec.r, damaged=rec.damaged[:_DAMAGED_CHARS])
        return
    entry = entries.get(rec.p)
    if entry is None:
        return  # settled and compacted away, or its admit was unreadable
    if isinstance(rec, _Dispatch):
        entry.dispatched = True
    elif isinstance(rec, _Observed):
        try:
            if rec.s.usage is not None:
                rec.s.usage.validate()
            check_settlement(entry.request, rec.s)
        except InvalidUsage as exc:
            raise _Unconvertible(f"s: {exc}") from None
        entry.settlement = rec.s
    else:
        del entries[rec.p]


def _reason(what: str, exc: BaseException) -> str:
    reason = f"{what}: {exc}"
    return reason if len(reason) <= _REASON_CHARS else reason[:_REASON_CHARS] + "…"


def _read_line(entries: dict[str, JournalEntry], line: bytes) -> str | None:
    """Apply one line; the reason it could not be, or None."""
    try:
        rec = _decode_record(line)
    except msgspec.ValidationError as exc:  # (a DecodeError too: caught first)
        return _reason("wrong shape", exc)
    except msgspec.DecodeError as exc:
        return _reason("not JSON", exc)
    except RecursionError:
        return "not JSON: nested too deeply"
    try:
        _convert(entries, rec)
    except _Unconvertible as exc:
        return _reason("cannot be replayed", exc)
    return None


@dataclass
class JournalScan:
    """A journal file as read: the permits it leaves open and the lines it could not."""

    entries: dict[str, JournalEntry] = field(default_factory=dict)
    rejected: list[RejectedLine] = field(default_factory=list)


def scan_journal(path: str | os.PathLike[str]) -> JournalScan:
    """Read a journal file (a missing one is empty) without raising on its content.

    A line that is not JSON, not one of the four record shapes, or a record the replay
    could not turn into a settlement a store takes (figures beyond the ceilings, an
    outcome that does not fit its permit's charges) is not applied: it is returned in
    :attr:`JournalScan.rejected` with its number and the reason. An open permit such a
    line may concern loses its proof of non-dispatch (:attr:`JournalEntry.damaged`): the
    line that nobody can read may have been its ``dispatch`` record. That is the permit
    the line names when its id can be recovered; otherwise every permit open at that
    line. Permits no bad line may concern come out exactly as if the bad lines were absent.
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
        reason = _read_line(scan.entries, line)
        if reason is None:
            continue
        kind, pid = _identify(line)
        bad = RejectedLine(number=number, reason=reason, raw=line, permit_id=pid,
                           record=kind)
        scan.rejected.append(bad)
        _mark_damaged(scan.entries, bad)
    return scan


_DAMAGED_CHARS = 200
"""A permit's damage note (line number and reason) is at most this long."""


def _mark_damaged(entries: dict[str, JournalEntry], bad: RejectedLine) -> None:
    note = f"journal line {bad.number} unreadable ({bad.reason})"[:_DAMAGED_CHARS]
    concerned = ([entries[bad.permit_id]] if bad.permit_id in entries
                 else [] if bad.permit_id is not None else list(entries.values()))
    for entry in concerned:
        if not entry.damaged:
            entry.damaged = note


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


# -- the quarantine (<journal>.rejected) ---------------------------------------------------

REJECTED_MAX_BYTES = 8 * 1024 * 1024
"""The most one quarantine file holds. Past it the file is rotated
(``<journal>.rejected`` → ``.rejected.1`` → … ``.rejected.<REJECTED_KEEP>``, the oldest
dropped), so a journal's quarantine never takes more than
``(1 + REJECTED_KEEP) * REJECTED_MAX_BYTES`` (32 MiB) whatever a disk or a hand edit
puts in the journal. A torn line is a few hundred bytes: only garbage comes near it."""
REJECTED_KEEP = 3
"""Rotated quarantine files kept besides the current one."""

_HEADER = b"#mayu-rejected "
"""Starts the line before each kept line (a record starts with ``{``)."""


class _KeptHeader(msgspec.Struct):
    line: int
    reason: str
    at: str = ""
    permit: str | None = None
    record: str | None = None


_decode_header = msgspec.json.Decoder(_KeptHeader).decode


def _kept_entry(line: RejectedLine, at: str) -> bytes:
    header = _KeptHeader(line=line.number, reason=line.reason, at=at,
                         permit=line.permit_id, record=line.record)
    return _HEADER + msgspec.json.encode(header) + b"\n" + line.raw + b"\n"


def quarantine_files(journal: str) -> list[str]:
    """The quarantine files of a journal that exist, oldest first."""
    names = [f"{journal}.rejected.{i}" for i in range(REJECTED_KEEP, 0, -1)]
    return [n for n in (*names, f"{journal}.rejected") if os.path.exists(n)]


def read_quarantine(path: str | os.PathLike[str]) -> list[RejectedLine]:
    """The lines a quarantine file keeps, with the journal line number and reason of
    each (from its header). A line without a header (written by 0.1.0, which kept the
    bare lines) is judged again alone, its number 0 (unknown)."""
    try:
        lines = Path(path).read_bytes().split(b"\n")
    except FileNotFoundError:
        return []
    out: list[RejectedLine] = []
    i = 0
    while i < len(lines):
        line, i = lines[i], i + 1
        header = _header_of(line)
        if header is not None and i < len(lines):
            raw, i = lines[i], i + 1
            out.append(RejectedLine(number=header.line, reason=header.reason, raw=raw,
                                    permit_id=header.permit, record=header.record,
                                    at=header.at))
        elif line.strip():
            kind, pid = _identify(line)
            out.append(RejectedLine(number=0, raw=line, permit_id=pid, record=kind,
                                    reason=_read_line({}, line) or "kept unreadable"))
    return out


def _header_of(line: bytes) -> _KeptHeader | None:
    if not line.startswith(_HEADER):
        return None
    try:
        header = _decode_header(line[len(_HEADER):])
    except (msgspec.DecodeError, RecursionError):
        return None
    return header if header.permit is None or _is_permit_id(header.permit) else None


def _rotate(path: str) -> None:
    """``path`` → ``path.1`` → … ``path.<REJECTED_KEEP>`` (the oldest replaced)."""
    for i in range(REJECTED_KEEP - 1, 0, -1):
        if os.path.exists(f"{path}.{i}"):
            os.replace(f"{path}.{i}", f"{path}.{i + 1}")
    os.replace(path, f"{path}.1")


def _append_durably(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:  # the file's directory entry (and a rotation's renames), before the rewrite's
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class Journal(AppendFile):
    """The append-only journal of one replica (see the module docstring)."""

    what = "journal"
    logger = log

    def __init__(self, path: str, *, fsync: str = "interval", fsync_interval_s: float = 1.0,
                 compact_bytes: int = _COMPACT_BYTES) -> None:
        super().__init__(path, fsync=fsync, fsync_interval_s=fsync_interval_s)
        self._compact_bytes = compact_bytes
        self._lock_fd: int | None = None
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
        # A folder it creates is its owner's only (0700), as the files in it (0600).
        Path(self.path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(lock_fd)
            raise ConfigError(f"server.journal_path: {self.path} is in use by another "
                              "process; every replica needs its own data dir "
                              "(mayu serve --data-dir) or replica id (--replica-id)") from exc
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

    async def close(self) -> None:
        await self._stop_syncer()
        self._close_fd()
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
            await asyncio.to_thread(self._sync_now)

    async def observed(self, permit_id: str, settlement: Settlement) -> None:
        entry = self.open_entries.get(permit_id)
        if entry is not None:
            entry.settlement = settlement
        self._write({"t": "outcome", "p": permit_id, "s": settlement})
        if self.fsync_always:
            await asyncio.to_thread(self._sync_now)

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

    def _quarantine(self, rejected: list[RejectedLine]) -> None:
        """Append the unreadable lines, each after a header naming its line number and
        reason (:func:`read_quarantine`), to :attr:`rejected_path` and make them durable;
        an error propagates (the journal is then left as it was). The file is rotated
        first when it would pass ``REJECTED_MAX_BYTES``; lines that would not fit an
        empty one are not kept (logged)."""
        at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        kept: list[bytes] = []
        size = 0
        for line in rejected:
            item = _kept_entry(line, at)
            if size + len(item) > REJECTED_MAX_BYTES:
                break
            kept.append(item)
            size += len(item)
        try:
            current = os.stat(self.rejected_path).st_size
        except FileNotFoundError:
            current = 0
        if current and current + size > REJECTED_MAX_BYTES:
            _rotate(self.rejected_path)
        if kept:
            _append_durably(self.rejected_path, b"".join(kept))
            log.warning("journal %s: %d unreadable line(s) kept in %s before compaction",
                        self.path, len(kept), self.rejected_path)
        if len(kept) < len(rejected):
            first, last = rejected[len(kept)].number, rejected[-1].number
            log.warning("journal %s: %d unreadable line(s) (lines %d..%d) not kept: a "
                        "quarantine file holds at most %d bytes", self.path,
                        len(rejected) - len(kept), first, last, REJECTED_MAX_BYTES)

    def _rewrite(self) -> None:
        """Atomically replace the file with records of the open permits only."""
        tmp = self.path + ".tmp"
        lines = []
        for e in self.open_entries.values():
            admit = {"t": "admit", "p": e.permit_id, "boot": e.boot, "sync": e.synced,
                     "r": e.request}
            if e.damaged:
                admit["damaged"] = e.damaged
            lines.append(admit)
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
