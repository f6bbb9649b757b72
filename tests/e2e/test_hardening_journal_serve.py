"""``mayu serve`` on a data dir whose journal holds unreadable lines (issue 25).

A real gateway process is started on a journal with a well-formed line of the wrong
shape, a binary line and a torn last line: it must serve (not exit 3 at every start, a
crash loop in a pod), say once per line what it skipped, and keep the lines aside.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from tests.e2e._procs import start_gateway

pytestmark = pytest.mark.e2e

SECRET = "sk-live-DO-NOT-LOG-91c2"


def test_serve_starts_on_a_journal_with_unreadable_lines(tmp_path: Path) -> None:
    """serve becomes ready; its log has one warning per bad line naming the journal and
    the line number (never the line's content); the lines are in <journal>.rejected."""
    journal = tmp_path / "data" / "journal-r1.jsonl"
    journal.parent.mkdir()
    bad = [b'{"t":"admit","p":"' + b"e" * 32 + b'","r":{"request_id":5,"note":"'
           + SECRET.encode() + b'"}}',
           b"\x00\xff" + SECRET.encode(),
           b'{"t":"dispatch","p":"' + SECRET.encode()]
    journal.write_bytes(b"\n".join(bad))
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"), "demo": False,
        "providers": [{"name": "in-process", "kind": "mock"}],
        "models": [{"name": "gpt-local", "deployments": [{"provider": "in-process"}]}],
        "server": {"replica_id": "r1", "journal_path": str(journal)}}))

    proc = start_gateway(config)
    try:
        logs = proc.logs()
    finally:
        proc.stop()
    for number in (1, 2, 3):
        [line] = [w for w in logs.splitlines() if f"line {number} skipped" in w]
        assert str(journal) in line and "WARNING" in line
    assert SECRET not in logs
    rejected = Path(str(journal) + ".rejected")
    assert rejected.read_bytes() == b"".join(b + b"\n" for b in bad)
    assert stat.S_IMODE(os.stat(rejected).st_mode) == 0o600
    assert journal.read_bytes() == b""
