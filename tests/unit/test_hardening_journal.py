"""Unreadable journal lines (issue 25): skipped with one warning each, kept, never fatal.

Each test writes a real journal through :class:`Journal` (the records a replica writes),
then appends the kind of line a crash, a bad disk or a hand edit leaves behind, and opens
it again as a restarted replica does. No part of the journal is mocked.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import msgspec
import pytest

from gateway.governance import (
    AdmissionRequest,
    Journal,
    Outcome,
    OutcomeKind,
    Permit,
    settlement_for,
)
from gateway.governance._journal import read_quarantine, scan_journal
from gateway.pricing import ModelPrice, Usage

PRICE = ModelPrice(input=1_000_000, output=5_000_000)
SECRET = "sk-live-DO-NOT-LOG-7f3a"
"""Planted in bad lines: no log line may carry a line's content."""


def _permit(pid: str) -> Permit:
    return Permit(id=pid, request=AdmissionRequest(
        request_id=f"req-{pid}", key_id="k1", key_revision=1, team_id="t1",
        team_revision=1, user=None, model="m", token_bound=100, usd_bound=1_000,
        policy_generation=0, charges=(), day="2026-11-29", month="2026-11"))


async def _write_clean(path: Path) -> None:
    """Four permits in every state a journal records: admitted only, dispatched, outcome
    observed, and settled (which leaves the journal open set)."""
    journal = Journal(str(path))
    journal.open()
    admitted, dispatched, observed, settled = (
        _permit("a" * 32), _permit("b" * 32), _permit("c" * 32), _permit("d" * 32))
    for p in (admitted, dispatched, observed, settled):
        journal.admitted(p)
    for p in (dispatched, observed, settled):
        await journal.dispatching(p.id)
    outcome = Outcome(kind=OutcomeKind.COMPLETE, usage=Usage(input=40, output=2))
    await journal.observed(observed.id, settlement_for(observed.request, outcome, PRICE))
    journal.settled(settled.id)
    await journal.close()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "mayu.journal" and r.levelno >= logging.WARNING]


async def test_wrong_shape_binary_and_torn_lines_are_skipped_logged_and_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A wrong-shape admit, a binary line and a torn last line do not stop open(): the
    readable permits come back exactly as from the clean journal, each bad line gets one
    warning (file, line number, reason, not its content), and all three are appended
    byte for byte (each after a header with its number and reason) to <journal>.rejected
    (0600) before the compaction drops them."""
    clean, path = tmp_path / "clean.jsonl", tmp_path / "journal-r1.jsonl"
    await _write_clean(clean)
    good = clean.read_bytes()
    wrong_shape = (b'{"t":"admit","p":"' + b"e" * 32 + b'","r":{"request_id":5,"key_id":"'
                   + SECRET.encode() + b'"}}')
    binary = b"\x00\xff\xfe" + SECRET.encode() + b"\x80\r\x01"
    torn = b'{"t":"outcome","p":"' + b"c" * 16 + SECRET.encode()
    lines = good.split(b"\n")[:-1]
    # Bad lines among good ones (line 2 and 5) and a torn last line without a newline.
    data = b"\n".join([lines[0], wrong_shape, *lines[1:3], binary, *lines[3:]]) + b"\n" + torn
    path.write_bytes(data)
    bad_numbers = [2, 5, len(lines) + 3]

    caplog.set_level(logging.INFO, logger="mayu.journal")
    journal = Journal(str(path))
    left = journal.open()
    await journal.close()

    # The binary line (5) names no permit: it may have been a record of any permit open
    # there (a, b, c), which so lose their proof of non-dispatch; nothing else changes.
    clean_entries = scan_journal(clean).entries
    assert {p: msgspec.structs.replace(e, damaged="") for p, e in left.items()} == clean_entries
    assert {p for p, e in left.items() if e.damaged.startswith("journal line 5 ")} == {
        "a" * 32, "b" * 32, "c" * 32}
    assert sorted(left) == ["a" * 32, "b" * 32, "c" * 32]
    assert left["c" * 32].settlement is not None and left["b" * 32].dispatched
    assert journal.rejected_lines == 3

    warned = _warnings(caplog)
    for number in bad_numbers:
        [line] = [w for w in warned if f"line {number} skipped" in w]
        assert str(path) in line
    [shape] = [w for w in warned if "line 2 skipped" in w]
    assert f"permit {'e' * 32}" in shape and "wrong shape" in shape and "request_id" in shape
    assert all("not JSON" in w for w in warned if "line 5 " in w or f"line {bad_numbers[2]} " in w)
    assert not any(SECRET in w for w in warned)

    rejected = Path(journal.rejected_path)
    kept = read_quarantine(rejected)
    assert [k.raw for k in kept] == [wrong_shape, binary, torn]
    assert [k.number for k in kept] == bad_numbers and SECRET.encode() not in b"".join(
        line for line in rejected.read_bytes().split(b"\n") if line.startswith(b"#"))
    assert stat.S_IMODE(os.stat(rejected).st_mode) == 0o600
    # The compacted journal holds the readable permits only and reads clean.
    again = scan_journal(path)
    assert again.rejected == [] and again.entries == left


async def test_quarantine_appends_and_a_clean_journal_creates_none(tmp_path: Path) -> None:
    """A second start with new unreadable lines appends them after the first ones (the
    quarantine keeps everything); a journal without bad lines creates no .rejected file."""
    path = tmp_path / "journal-r1.jsonl"
    await _write_clean(path)
    journal = Journal(str(path))
    journal.open()
    await journal.close()
    assert not Path(journal.rejected_path).exists() and journal.rejected_lines == 0

    for garbage in (b"\xde\xad\xbe\xef", b'["not", "a", "record"]'):
        with path.open("ab") as f:
            f.write(garbage + b"\n")
        journal = Journal(str(path))
        assert sorted(journal.open()) == ["a" * 32, "b" * 32, "c" * 32]
        await journal.close()
        assert journal.rejected_lines == 1
    assert [k.raw for k in read_quarantine(journal.rejected_path)] == [
        b"\xde\xad\xbe\xef", b'["not", "a", "record"]']
