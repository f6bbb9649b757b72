"""``mayu serve`` on a data dir whose journal holds unreadable lines (issue 25).

A real gateway process is started on a journal a crash and a bad disk damaged: a
well-formed line of the wrong shape, a binary line and a torn last line among the
records of permits the local store really granted. It must serve (not exit 3 at every
start, a crash loop in a pod), say once per line what it skipped, keep the lines aside,
and resolve every permit whose records were readable; the one whose ``admit`` line was
unreadable stays pending, and ``mayu permits list`` (a real CLI process) marks it with
the line and the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from gateway.governance import (
    LocalGovernanceStore,
    Outcome,
    OutcomeKind,
    Permit,
    boot_id,
    settlement_for,
)
from gateway.governance._journal import read_quarantine, scan_journal
from gateway.keys import SqliteKeyStore, TeamLimits
from gateway.pricing import ModelPrice, Usage
from tests.e2e._procs import run_cli, start_gateway
from tests.integration._pg_helpers import principal, request

pytestmark = pytest.mark.e2e

SECRET = "sk-live-DO-NOT-LOG-91c2"


async def _granted(data: Path, n: int) -> list[Permit]:
    """``n`` permits the gateway's own local store grants, left pending (a crash)."""
    db = str(data / "mayu.db")
    # (principal() is typed for the Postgres key store; the SQLite one has its methods)
    keys: Any = SqliteKeyStore(db)
    gov = LocalGovernanceStore(db)
    await keys.open()
    await gov.open()
    try:
        p = await principal(keys, team="t1", limits=TeamLimits(usd_micros_per_day=10**6))
        permits = []
        for i in range(n):
            [permit] = await gov.admit([request(p, tokens=100, usd=1_000, rid=f"r{i}")])
            assert isinstance(permit, Permit), permit
            permits.append(permit)
        return permits
    finally:
        await gov.close()
        await keys.close()


def _write_journal(path: Path, observed: Permit, dispatched: Permit, bad_admit: Permit,
                   never: Permit) -> list[bytes]:
    """The journal a crashed replica leaves (its records as :class:`Journal` writes
    them), damaged at lines 3, 5 and 9; returns those lines."""
    boot = boot_id()

    def admit(p: Permit) -> bytes:
        return msgspec.json.encode({"t": "admit", "p": p.id, "boot": boot, "sync": False,
                                    "r": p.request})

    outcome = settlement_for(observed.request, Outcome(
        kind=OutcomeKind.COMPLETE, usage=Usage(input=40, output=2)),
        ModelPrice(input=1_000_000, output=5_000_000))
    bad = [b'{"t":"admit","p":"' + bad_admit.id.encode() + b'","r":{"request_id":5,'
           b'"note":"' + SECRET.encode() + b'"}}',
           b"\x00\xff" + SECRET.encode(),
           b'{"t":"outcome","p":"' + dispatched.id.encode() + b'","s":{"detail":"'
           + SECRET.encode()]
    lines = [admit(observed),                                               # 1
             b'{"t":"dispatch","p":"' + observed.id.encode() + b'"}',       # 2
             bad[0],                                                        # 3
             msgspec.json.encode({"t": "outcome", "p": observed.id, "s": outcome}),
             bad[1],                                                        # 5
             # Admitted after the binary line: it cannot be one of their records.
             admit(dispatched), admit(never),                               # 6, 7
             b'{"t":"dispatch","p":"' + dispatched.id.encode() + b'"}',     # 8
             bad[2]]                                                        # 9, torn
    path.write_bytes(b"\n".join(lines))
    return bad


def test_serve_starts_on_a_damaged_journal_and_resolves_every_intact_permit(
        tmp_path: Path) -> None:
    """serve becomes ready; its log has one warning per bad line naming the journal and
    the line number (never the line's content); the lines are kept byte for byte in
    <journal>.rejected (0600); the observed permit settles complete, the never
    dispatched one cancelled, the dispatched one uncertain (its torn outcome named in
    the detail); the one whose admit line was unreadable stays pending and permits list
    marks it with line 3 and the reason; nothing is left open in the journal."""
    data = tmp_path / "data"
    data.mkdir()
    journal = data / "journal-r1.jsonl"
    observed, dispatched, bad_admit, never = asyncio.run(_granted(data, 4))
    bad = _write_journal(journal, observed, dispatched, bad_admit, never)
    config = tmp_path / "gw.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(data), "demo": False,
        "providers": [{"name": "in-process", "kind": "mock"}],
        "models": [{"name": "gpt-local", "deployments": [{"provider": "in-process"}]}],
        "server": {"replica_id": "r1", "journal_path": str(journal)}}))

    proc = start_gateway(config)
    try:
        logs = proc.logs()
        listed = run_cli("permits", "list", "--json", "--config", str(config))
        table = run_cli("permits", "list", "--pending", "--config", str(config))
    finally:
        proc.stop()
    for number in (3, 5, 9):
        [line] = [w for w in logs.splitlines() if f"line {number} skipped" in w]
        assert str(journal) in line and "WARNING" in line
    assert sum(" skipped" in w for w in logs.splitlines()) == 3
    assert SECRET not in logs
    rejected = Path(str(journal) + ".rejected")
    assert [(k.number, k.raw) for k in read_quarantine(rejected)] == list(
        zip((3, 5, 9), bad, strict=True))
    assert stat.S_IMODE(os.stat(rejected).st_mode) == 0o600

    assert listed.returncode == 0, listed.stderr
    status = {row["id"]: row for row in json.loads(listed.stdout)}
    assert status[observed.id]["status"] == "complete"
    assert status[observed.id]["usd_committed"] == 50
    assert status[never.id]["status"] == "cancelled"
    assert status[dispatched.id]["status"] == "uncertain"
    assert "journal line 9 unreadable (not JSON" in status[dispatched.id]["detail"]
    assert status[bad_admit.id]["status"] == "pending"
    [note] = status[bad_admit.id]["journal"]
    assert f"{journal} line 3 (kept in {rejected}, " in note and "wrong shape" in note

    assert table.returncode == 0, table.stderr
    assert f"{bad_admit.id} *" in table.stdout and SECRET not in table.stdout
    left = scan_journal(journal)  # compacted at start, then each permit's settled record
    assert left.entries == {} and left.rejected == []
