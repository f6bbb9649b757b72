"""The journal reader under fuzzing (issue 25): whatever a line holds, reading never raises.

A clean journal is written as :class:`Journal` writes it (one permit in each state, with
bucket, window and request charges), then hypothesis inserts lines a crash, a bad disk
or a hand edit could leave: random bytes, truncated records, records with one field
replaced by junk JSON (wrong types, huge or negative ints, nested junk, NUL), invalid
UTF-8, JSON nested past any parser's depth. Every property is checked on the real reader
(:func:`scan_journal`), the real start-up path (:meth:`Journal.open`: quarantine and
compaction in a temp dir) and the real replay conversion (:func:`recovered_outcome`,
:func:`settlement_for` and the stores' own :func:`check_settlement`). The last test
pins the quarantine's bound (rotation of ``<journal>.rejected``).
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.governance import (
    AdmissionRequest,
    Charge,
    Journal,
    Outcome,
    OutcomeKind,
    _journal,
    settlement_for,
)
from gateway.governance._journal import (
    JournalEntry,
    read_quarantine,
    recovered_outcome,
    scan_journal,
)
from gateway.governance._plan import check_settlement
from gateway.pricing import ModelPrice, Usage

PRICE = ModelPrice(input=1_000_000, output=5_000_000)
BOOT = "boot-of-this-run"
FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def _request(pid: str) -> AdmissionRequest:
    return AdmissionRequest(
        request_id=f"req-{pid}", key_id="k1", key_revision=1, team_id="t1",
        team_revision=1, user=None, model="m", token_bound=100, usd_bound=1_000,
        policy_generation=0, day="2026-11-29", month="2026-11", charges=(
            Charge(counter="team:t1:rpm", kind="bucket", dimension="requests", amount=1,
                   limit=60),
            Charge(counter="team:t1:tpm", kind="bucket", dimension="tokens", amount=100,
                   limit=10_000),
            Charge(counter="key:k1:usd:day:2026-11-29", kind="window", dimension="usd",
                   amount=1_000, limit=50_000, window="2026-11-29")))


def _clean_records() -> list[dict[str, Any]]:
    """Admitted only, dispatched, outcome observed, settled: as a replica writes them."""
    ids = ("a" * 32, "b" * 32, "c" * 32, "d" * 32)
    records: list[dict[str, Any]] = [
        {"t": "admit", "p": p, "boot": BOOT, "sync": False, "r": _request(p)} for p in ids]
    records += [{"t": "dispatch", "p": p} for p in ids[1:]]
    outcome = Outcome(kind=OutcomeKind.COMPLETE, usage=Usage(input=40, output=2))
    for p in ids[2:]:
        records.append({"t": "outcome", "p": p,
                        "s": settlement_for(_request(p), outcome, PRICE)})
    records.append({"t": "settled", "p": ids[3]})
    return [msgspec.to_builtins(r) for r in records]


CLEAN = [msgspec.json.encode(r) for r in _clean_records()]

junk = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats() | st.text(st.characters(codec="utf-8"), max_size=12),
    lambda kids: st.lists(kids, max_size=3)
    | st.dictionaries(st.text(max_size=4), kids, max_size=3),
    max_leaves=6)


def _paths(value: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a decoded record a value could be replaced (keys and indices)."""
    found = [here] if here else []
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*here, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*here, i))
    return found


def _replace(record: Any, path: tuple[Any, ...], new: Any) -> Any:
    copy = json.loads(json.dumps(record))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = new
    return copy


@st.composite
def wrong_shape(draw: st.DrawFn) -> bytes:
    """A clean record with one field (at any depth) replaced by junk JSON."""
    record = json.loads(draw(st.sampled_from(CLEAN)))
    path = draw(st.sampled_from(_paths(record)))
    return json.dumps(_replace(record, path, draw(junk)), ensure_ascii=False).encode()


@st.composite
def damaged_bytes(draw: st.DrawFn) -> bytes:
    """A clean record cut short, or with a NUL or invalid UTF-8 byte put inside."""
    line = draw(st.sampled_from(CLEAN))
    at = draw(st.integers(0, len(line) - 1))
    how = draw(st.sampled_from(("cut", "nul", "utf8")))
    if how == "cut":
        return line[:at]
    return line[:at] + (b"\x00" if how == "nul" else b"\xff\xc3(") + line[at:]


bad_line = st.one_of(
    st.binary(max_size=64),
    wrong_shape(),
    damaged_bytes(),
    st.integers(1, 5000).map(lambda n: b'{"t":"admit","p":"x","r":' + b"[" * n),
    st.integers(2000, 5000).map(lambda n: b"[" * n + b"]" * n),
).map(lambda b: b.replace(b"\n", b""))


@st.composite
def dirty_journal(draw: st.DrawFn) -> tuple[list[bytes], list[int]]:
    """The clean lines with bad lines inserted anywhere (possibly last, unterminated):
    the lines, and the 1-based numbers of the inserted ones."""
    lines = list(CLEAN)
    inserted: list[tuple[int, bytes]] = draw(st.lists(
        st.tuples(st.integers(0, len(CLEAN)), bad_line), min_size=1, max_size=4))
    for at, bad in sorted(inserted, key=lambda x: x[0], reverse=True):
        lines.insert(at, bad)
    numbers = [i for i, line in enumerate(lines, 1)
               if line not in CLEAN or lines.index(line) != i - 1]
    return lines, numbers


def _replayed(entry: JournalEntry) -> None:
    """What the Governor (and ``permits resolve --journal``) does with an open entry;
    the stores refuse a settlement that fails check_settlement."""
    settlement = entry.settlement or settlement_for(entry.request,
                                                    recovered_outcome(entry, BOOT))
    check_settlement(entry.request, settlement)
    if entry.damaged:
        assert settlement.kind is not OutcomeKind.CANCELLED


def _write(path: Path, lines: list[bytes], *, torn: bool) -> None:
    path.write_bytes(b"\n".join(lines) + (b"" if torn else b"\n"))


@FAST
@given(dirty_journal(), st.booleans())
def test_reading_never_raises_and_intact_permits_are_read(
        journal: tuple[list[bytes], list[int]], torn: bool) -> None:
    """Bad lines anywhere (the last one possibly torn): scan_journal never raises; each
    open permit no inserted line names comes out as in the clean journal; every open
    permit converts to a settlement a store takes; a permit an unreadable line may
    concern (it names it, or names none and comes after its admit) is never cancelled."""
    lines, inserted = journal
    with tempfile.TemporaryDirectory() as tmp:
        path, clean = Path(tmp) / "journal.jsonl", Path(tmp) / "clean.jsonl"
        _write(path, lines, torn=torn)
        _write(clean, CLEAN, torn=False)
        scan, expected = scan_journal(path), scan_journal(clean).entries

    rejected = {bad.number for bad in scan.rejected}
    # An inserted line that is a valid record (a mutation that still fits) legitimately
    # changes its permit: such permits are left out of the checks below.
    valid = b"".join(lines[n - 1] for n in inserted if n not in rejected)
    named = b"".join(lines[n - 1] for n in inserted)
    for bad in scan.rejected:
        assert bad.raw == lines[bad.number - 1] and len(bad.reason) <= 121
        assert bad.number in inserted or (  # a clean admit after a valid inserted one
            bad.permit_id is not None and bad.permit_id.encode() in valid)
    for pid, entry in expected.items():
        if pid.encode() not in named:
            got = scan.entries[pid]
            assert (got.request, got.dispatched, got.settlement) == (
                entry.request, entry.dispatched, entry.settlement)
    for entry in scan.entries.values():
        _replayed(entry)
    admitted_at = {json.loads(line)["p"]: lines.index(line) + 1 for line in CLEAN
                   if line.startswith(b'{"t":"admit"')}
    for bad in scan.rejected:  # a line may be the record of a permit admitted before it
        concerned = {p for p in scan.entries if p.encode() not in valid
                     and admitted_at[p] < bad.number and bad.permit_id in (None, p)}
        assert all(scan.entries[p].damaged for p in concerned)


@FAST
@given(dirty_journal())
async def test_start_up_quarantines_every_bad_line_and_compacts_clean(
        journal: tuple[list[bytes], list[int]]) -> None:
    """Journal.open on a dirty file never raises; what it returns is what scan_journal
    reads; every rejected line is in <journal>.rejected byte for byte with its number;
    the compacted file reads with no rejected line and the same permits (damage kept)."""
    lines, _ = journal
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.jsonl"
        _write(path, lines, torn=True)
        scan = scan_journal(path)
        j = Journal(str(path))
        left = j.open()
        await j.close()
        kept = read_quarantine(j.rejected_path)
        again = scan_journal(path)
    assert left == scan.entries and j.rejected_lines == len(scan.rejected)
    assert [(k.number, k.raw, k.permit_id) for k in kept] == [
        (b.number, b.raw, b.permit_id) for b in scan.rejected]
    assert again.rejected == [] and again.entries == left


@FAST
@given(st.lists(st.one_of(bad_line, st.just(b"#mayu-rejected "), st.binary(max_size=40).map(
    lambda b: b"#mayu-rejected " + b.replace(b"\n", b""))), max_size=6))
def test_reading_a_damaged_quarantine_never_raises(lines: list[bytes]) -> None:
    """read_quarantine on junk (headers without lines, headers of junk, bare lines)
    never raises and returns only lines that were in the file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.jsonl.rejected"
        path.write_bytes(b"\n".join(lines))
        kept = read_quarantine(path)
    for k in kept:
        assert k.raw in lines or k.raw == b""


async def test_the_quarantine_is_rotated_and_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Twenty starts, each on a journal with a new ~1 kB bad line, under a 4 kB cap: the
    quarantine rotates to .rejected.1..3 (REJECTED_KEEP), never holds a file above the
    cap nor a fourth old copy, and keeps the newest lines in order; a batch larger than
    the cap keeps what fits and logs the line numbers it could not keep."""
    cap = 4096
    monkeypatch.setattr(_journal, "REJECTED_MAX_BYTES", cap)
    path = tmp_path / "journal.jsonl"
    bad = [b'{"t":"dispatch","p":"' + bytes([65 + i]) * 1000 for i in range(20)]
    for line in bad:
        path.write_bytes(CLEAN[0] + b"\n" + line)
        j = Journal(str(path))
        j.open()
        await j.close()
    files = _journal.quarantine_files(str(path))
    assert [f.rsplit(".", 1)[-1] for f in files] == ["3", "2", "1", "rejected"]
    assert all(Path(f).stat().st_size <= cap for f in files)
    kept = [k.raw for f in files for k in read_quarantine(f)]
    assert kept == bad[-len(kept):] and 3 * _journal.REJECTED_KEEP < len(kept) < len(bad)

    path.write_bytes(b"\n".join([CLEAN[0], *bad]))
    caplog.set_level(logging.WARNING, logger="mayu.journal")
    j = Journal(str(path))
    j.open()
    await j.close()
    assert [k.raw for k in read_quarantine(j.rejected_path)] == bad[:3]
    assert any("17 unreadable line(s) (lines 5..21) not kept" in r.getMessage()
               for r in caplog.records)
