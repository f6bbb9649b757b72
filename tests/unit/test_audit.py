"""The audit file: one whole JSON line per write, fsync policies, rotation by size and
after an external rename (logrotate), on real files in a temporary directory."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from gateway.audit import AuditLog, rotated_paths


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _all_lines(path: Path, keep: int) -> list[dict[str, object]]:
    """Every line of the file and its rotated predecessors, oldest first."""
    out: list[dict[str, object]] = []
    for p in reversed(rotated_paths(str(path), keep)):
        if os.path.exists(p):
            out += _lines(Path(p))
    return out


def test_each_record_is_one_json_line_with_a_timestamp(tmp_path: Path) -> None:
    """Every write appends exactly one parseable line carrying ``ts`` and the record."""
    audit = AuditLog(str(tmp_path / "a" / "audit.jsonl"))
    audit.open()
    for i in range(3):
        audit.write({"event": "admitted", "i": i})
    audit.close()
    lines = _lines(tmp_path / "a" / "audit.jsonl")
    assert [line["i"] for line in lines] == [0, 1, 2]
    assert all("ts" in line for line in lines)


def test_rotation_by_size_keeps_n_files_and_never_splits_a_line(tmp_path: Path) -> None:
    """Past max_bytes the file becomes .1 (older ones shift), at most ``keep`` rotated
    files remain, every file holds whole lines only and the kept lines are the newest,
    in order, with none missing between them."""
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(path), max_bytes=2_000, keep=3)
    audit.open()
    for i in range(400):
        audit.write({"event": "settled", "i": i, "pad": "x" * (i % 50)})
    audit.close()
    assert audit.rotations > 3
    assert not os.path.exists(f"{path}.4")
    for p in rotated_paths(str(path), 3):
        assert os.path.getsize(p) <= 2_000 + 200  # one line may cross the limit
        assert Path(p).read_text().endswith("\n")
    kept = [line["i"] for line in _all_lines(path, 3)]
    assert kept == list(range(kept[0], 400))
    assert kept[0] > 0  # the oldest files were removed


def test_external_rename_is_followed(tmp_path: Path) -> None:
    """After logrotate renames the file, the next line goes to a new file at the path;
    nothing more is written to the renamed one."""
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(path))
    audit.open()
    audit.write({"i": 0})
    os.rename(path, tmp_path / "audit.jsonl.rotated")
    audit.write({"i": 1})
    audit.write({"i": 2})
    audit.close()
    assert [line["i"] for line in _lines(tmp_path / "audit.jsonl.rotated")] == [0]
    assert [line["i"] for line in _lines(path)] == [1, 2]
    assert audit.reopens == 1


def test_removed_file_is_recreated(tmp_path: Path) -> None:
    """A file deleted under the gateway is recreated at the next line."""
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(path))
    audit.open()
    audit.write({"i": 0})
    path.unlink()
    audit.write({"i": 1})
    audit.close()
    assert [line["i"] for line in _lines(path)] == [1]


def test_copytruncate_does_not_rotate_early(tmp_path: Path) -> None:
    """A file truncated in place (copytruncate) is measured again, not rotated as if it
    still held what was written before."""
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(str(path), max_bytes=1_000, keep=2)
    audit.open()
    for i in range(12):
        audit.write({"i": i, "pad": "y" * 40})
    os.truncate(path, 0)
    for i in range(12, 20):
        audit.write({"i": i, "pad": "y" * 40})
    audit.close()
    assert [line["i"] for line in _lines(path)] == list(range(12, 20))


def test_always_fsyncs_every_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With audit_fsync: always, each line is fsynced before write() returns."""
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    audit = AuditLog(str(tmp_path / "audit.jsonl"), fsync="always")
    audit.open()
    for i in range(5):
        audit.write({"i": i})
    assert len(synced) == 5
    audit.close()


async def test_interval_fsyncs_within_the_interval(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With audit_fsync: interval, written lines are fsynced within the interval, and
    an idle file is not fsynced again."""
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    audit = AuditLog(str(tmp_path / "audit.jsonl"), fsync_interval_s=0.05)
    audit.open()
    audit.start()
    audit.write({"i": 0})
    audit.write({"i": 1})
    assert synced == []
    await asyncio.sleep(0.2)
    assert len(synced) == 1
    await asyncio.sleep(0.15)
    assert len(synced) == 1  # nothing new was written
    await audit.aclose()


def test_a_torn_last_line_is_ended_at_the_next_open(tmp_path: Path) -> None:
    """A file left ending inside a line (a crash mid-write) gets a newline when reopened,
    so the fragment stays one bad line and the next run's lines parse."""
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"i": 0}\n{"i": 1, "trunc')
    audit = AuditLog(str(path))
    audit.open()
    audit.write({"i": 2})
    audit.close()
    lines = path.read_text().splitlines()
    assert lines[1] == '{"i": 1, "trunc'
    assert json.loads(lines[2])["i"] == 2
