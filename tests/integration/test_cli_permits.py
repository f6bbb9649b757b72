"""``mayu permits`` / ``mayu accounts`` run as real subprocesses, on both profiles.

Every test runs twice: against a temp local data dir (``.mayu/mayu.db``, the file the
gateway's key and governance stores share) and against a real migrated Postgres (the
``pg_dsn`` fixture) through a shared-profile config. Permits are created through the
store itself, exactly as a gateway admits them, then left pending as a crash would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.config import DatabaseSettings
from gateway.governance import (
    Journal,
    LocalGovernanceStore,
    Outcome,
    OutcomeKind,
    Permit,
    PostgresGovernanceStore,
)
from gateway.keys import SqliteKeyStore, TeamLimits
from gateway.pricing import Usage
from tests.integration._pg_helpers import principal, request
from tests.settling import settlement

ROOT = Path(__file__).resolve().parents[2]
MODELS = """providers: [{name: mock, kind: mock}]
models:
  - name: m
    deployments: [{provider: mock}]
    price: {input: 1000000, output: 5000000}
"""
SHARED = """key_store: {type: postgres}
governance_store: {type: postgres}
database: {dsn_ref: env:G_PERMITS_DSN}
""" + MODELS
LIMITS = TeamLimits(usd_micros_per_day=10_000, tpm=100_000)


@dataclass
class Backend:
    """One profile: where the CLI runs, its extra flags and env, and the open stores."""

    name: str
    cwd: Path
    flags: tuple[str, ...]
    env: dict[str, str]
    keys: Any
    gov: Any
    dsn: str | None = None

    def mayu(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), **self.env}
        return subprocess.run([sys.executable, "-m", "gateway", *args, *self.flags],
                              cwd=self.cwd, env=env, capture_output=True, text=True,
                              timeout=120)

    def ok(self, *args: str) -> str:
        done = self.mayu(*args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    async def counter(self, name: str) -> tuple[int, int, bool]:
        """(reserved, committed, frozen) of a window counter as stored."""
        row = await self.gov.counter(name)
        if isinstance(row, dict):
            return row["reserved"], row["committed"], row["frozen"]
        return row.reserved, row.committed, row.frozen_by is not None

    async def liability(self, name: str) -> int:
        row = await self.gov.counter(name)
        return int(row["liability"] if isinstance(row, dict) else row.liability)

    def backdate(self, permit_id: str, minutes: int) -> None:
        """Make a permit look admitted ``minutes`` earlier (a gateway crashed long ago)."""
        if self.dsn is None:
            import sqlite3
            with sqlite3.connect(self.cwd / ".mayu" / "mayu.db") as conn:
                conn.execute("UPDATE gov_permits SET created_us = created_us - ? WHERE id = ?",
                             (minutes * 60_000_000, permit_id))
            return
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("UPDATE permits SET created_at = created_at - %s * interval '1 minute'"
                         " WHERE id = %s", (minutes, permit_id))


@pytest.fixture(params=["local", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Backend]:
    if request.param == "local":
        db = str(tmp_path / ".mayu" / "mayu.db")
        keys, gov = SqliteKeyStore(db), LocalGovernanceStore(db)
        await keys.open()
        await gov.open()
        (tmp_path / "local.yaml").write_text(f"data_dir: {tmp_path / '.mayu'}\n" + MODELS)
        try:
            yield Backend("local", tmp_path, ("--config", str(tmp_path / "local.yaml")), {},
                          keys, gov)
        finally:
            await gov.close()
            await keys.close()
        return
    from gateway.db import open_pool
    from gateway.keys import PostgresKeyStore

    dsn = request.getfixturevalue("pg_dsn")
    monkeypatch.setenv("G_PERMITS_DSN", dsn)
    (tmp_path / "shared.yaml").write_text(SHARED)
    pool = open_pool(DatabaseSettings(dsn_ref="env:G_PERMITS_DSN", pool_min_size=1,
                                      pool_max_size=2))
    await pool.open(wait=True)
    try:
        yield Backend("postgres", tmp_path, ("--config", str(tmp_path / "shared.yaml")),
                      {"G_PERMITS_DSN": dsn}, PostgresKeyStore(pool),
                      PostgresGovernanceStore(pool), dsn)
    finally:
        await pool.close()


async def admit(b: Backend, rid: str, *, usd: int = 1_000, tokens: int = 100) -> Permit:
    """A permit granted through the store, as a gateway would (then left pending)."""
    team = "t1"
    p = await principal(b.keys, team=team, limits=LIMITS)
    [permit] = await b.gov.admit([request(p, tokens=tokens, usd=usd, rid=rid)])
    assert isinstance(permit, Permit), permit
    return permit


async def crashed_journal(path: Path, never: Permit, seen: Permit) -> None:
    """A crashed replica's journal at ``path``: ``never`` admitted only, ``seen``
    admitted, dispatched and observed complete (40 input + 2 output tokens)."""
    journal = Journal(str(path))
    journal.open()
    journal.admitted(never)
    journal.admitted(seen)
    await journal.dispatching(seen.id)
    await journal.observed(seen.id, settlement(seen.request, Outcome(
        kind=OutcomeKind.COMPLETE, usage=Usage(input=40, output=2))))
    await journal.close()


def usd_day(permit: Permit) -> str:
    [name] = [c.counter for c in permit.request.charges
              if c.counter.startswith("team:") and ":usd:day:" in c.counter]
    return name


async def test_pending_permit_listed_resolved_replayed_and_conflict_refused(backend):
    """A pending permit is listed; resolving it as uncertain turns its bounds into
    liability (reserved 0, committed 0); the same resolution again is a no-op replay; the
    other outcome is refused, exit 2, showing the stored outcome."""
    b = backend
    permit = await admit(b, "req-crashed", usd=1_000, tokens=100)
    window = usd_day(permit)
    assert await b.counter(window) == (1_000, 0, False)

    [row] = json.loads(b.ok("permits", "list", "--pending", "--json"))
    assert (row["id"], row["request_id"], row["key_id"], row["team_id"], row["model"],
            row["token_bound"], row["usd_bound"], row["status"]) == (
        permit.id, "req-crashed", permit.request.key_id, permit.request.team_id, "m",
        100, 1_000, "pending")
    table = b.ok("permits", "list", "--pending")
    assert permit.id in table and "req-crashed" in table and "$0.001" in table

    out = b.ok("permits", "resolve", permit.id, "--as", "uncertain", "--reason", "r1 died")
    assert out.strip() == (f"resolved permit {permit.id} as uncertain: committed 0 "
                           "tokens, $0.00, liability 100 tokens, $0.001")
    assert await b.counter(window) == (0, 0, False)
    assert await b.liability(window) == 1_000
    assert b.ok("permits", "list", "--pending").strip() == "no pending permits"
    [settled] = json.loads(b.ok("permits", "list", "--json"))
    assert (settled["status"], settled["detail"]) == ("uncertain", "operator: r1 died")

    again = b.ok("permits", "resolve", permit.id, "--as", "uncertain")
    assert "already resolved as uncertain" in again and "nothing changed" in again
    assert await b.counter(window) == (0, 0, False)

    other = b.mayu("permits", "resolve", permit.id, "--as", "cancelled")
    assert other.returncode == 2
    assert (f"permit {permit.id} was already settled as uncertain: committed 0 tokens, "
            "$0.00 (operator: r1 died); resolving it as cancelled is refused") in other.stderr
    assert await b.counter(window) == (0, 0, False)


async def test_an_exact_figure_settles_a_pending_permit_and_resolves_a_liability(backend):
    """--usage settles a pending permit at the priced usage; on an uncertain permit it
    replaces the liability by the exact figure (committed moves, liability goes)."""
    b = backend
    pending = await admit(b, "exact-pending", usd=9_000, tokens=1_000)
    out = b.ok("permits", "resolve", pending.id, "--usage", '{"input": 500, "output": 100}',
               "--reason", "provider invoice")
    assert "as complete: committed 600 tokens, $0.001" in out
    window = usd_day(pending)
    assert await b.counter(window) == (0, 1_000, False)

    lost = await admit(b, "exact-later", usd=4_000, tokens=1_000)
    b.ok("permits", "resolve", lost.id, "--as", "uncertain")
    assert await b.liability(window) == 4_000
    out = b.ok("permits", "resolve", lost.id, "--cost-micro-usd", "1234", "--tokens", "77")
    assert "as complete: committed 77 tokens, $0.001234" in out
    assert await b.counter(window) == (0, 1_000 + 1_234, False)
    assert await b.liability(window) == 0
    again = b.mayu("permits", "resolve", lost.id, "--cost-micro-usd", "99", "--tokens", "1")
    assert again.returncode == 2 and "only an uncertain or tokens-known" in again.stderr


async def test_an_exact_figure_sent_twice_is_a_replay_and_another_a_conflict(backend):
    """The same exact figure again (a pending permit settled by it, an uncertain one
    resolved by it) is a replay that changes nothing; a different figure is refused."""
    b = backend
    pending = await admit(b, "twice-pending", usd=4_000, tokens=1_000)
    lost = await admit(b, "twice-lost", usd=4_000, tokens=1_000)
    b.ok("permits", "resolve", lost.id, "--as", "uncertain")
    window = usd_day(pending)
    for permit in (pending, lost):
        first = b.ok("permits", "resolve", permit.id, "--cost-micro-usd", "77",
                     "--tokens", "9")
        assert first.strip() == (f"resolved permit {permit.id} as complete: committed 9 "
                                 "tokens, $0.000077")
        figures = (await b.counter(window), await b.liability(window))
        again = b.ok("permits", "resolve", permit.id, "--cost-micro-usd", "77",
                     "--tokens", "9", "--reason", "said twice")
        assert again.strip() == (f"permit {permit.id} was already resolved as complete: "
                                 "committed 9 tokens, $0.000077; nothing changed")
        assert (await b.counter(window), await b.liability(window)) == figures
        other = b.mayu("permits", "resolve", permit.id, "--cost-micro-usd", "78",
                       "--tokens", "9")
        assert other.returncode == 2 and "already settled as complete" in other.stderr
    assert await b.counter(window) == (0, 154, False)
    assert await b.liability(window) == 0


async def test_bulk_resolution_uses_the_crashed_replicas_journal(backend):
    """--journal: a permit its replica never dispatched is cancelled (refunded), one it
    saw finish is settled as observed; one missing from the journal stays uncertain."""
    b = backend
    never, seen, unknown = (await admit(b, "never"), await admit(b, "seen"),
                            await admit(b, "unknown"))
    await crashed_journal(b.cwd / "journal-r1.jsonl", never, seen)
    for p in (never, seen, unknown):
        b.backdate(p.id, 90)
    out = b.ok("permits", "resolve", "--all-older-than-minutes", "60",
               "--journal", str(b.cwd / "journal-r1.jsonl"))
    assert f"resolved permit {never.id} as cancelled" in out
    assert f"resolved permit {seen.id} as complete: committed 42 tokens" in out
    assert f"resolved permit {unknown.id} as uncertain" in out
    assert "(from its journal)" in out
    # TEST_PRICE: 40 input at $1/Mtok + 2 output at $5/Mtok = 50 µUSD; the rest refunded.
    assert await b.counter(usd_day(never)) == (0, 50, False)


async def test_cancelled_resolution_refunds_the_reservation(backend):
    """--as cancelled releases the whole reservation and commits nothing."""
    permit = await admit(backend, "never-sent", usd=2_500)
    out = backend.ok("permits", "resolve", permit.id, "--as", "cancelled")
    assert "as cancelled: committed 0 tokens, $0.00" in out
    assert await backend.counter(usd_day(permit)) == (0, 0, False)


async def test_unknown_permit_is_named(backend):
    """Resolving a permit the store never granted exits 2 and names it."""
    missing = "0123456789abcdef0123456789abcdef"
    for pid in (missing, "not-a-permit"):
        done = backend.mayu("permits", "resolve", pid, "--as", "uncertain")
        assert done.returncode == 2
        assert f"permit {pid!r}: no such permit" in done.stderr


async def test_bulk_mode_resolves_only_old_pending_permits(backend):
    """--all-older-than-minutes resolves (uncertain) every permit pending at least that
    long, one progress line each, and leaves younger ones pending; cancelled is refused."""
    b = backend
    old, young = await admit(b, "old"), await admit(b, "young")
    b.backdate(old.id, 90)
    listed = json.loads(b.ok("permits", "list", "--pending", "--older-than-minutes", "60",
                             "--json"))
    assert [p["id"] for p in listed] == [old.id] and listed[0]["age_s"] >= 90 * 60

    refused = b.mayu("permits", "resolve", "--all-older-than-minutes", "60",
                     "--as", "cancelled")
    assert refused.returncode == 2 and "only with --as uncertain" in refused.stderr

    out = b.ok("permits", "resolve", "--all-older-than-minutes", "60", "--as", "uncertain")
    lines = out.strip().splitlines()
    assert lines[0].startswith(f"[1/1] resolved permit {old.id} as uncertain")
    assert lines[-1] == "1 of 1 pending permits older than 60 min resolved"
    pending = json.loads(b.ok("permits", "list", "--pending", "--json"))
    assert [p["id"] for p in pending] == [young.id]


async def test_unfreeze_lifts_a_freeze_made_by_invalid_usage(backend):
    """An INVALID settlement freezes the team's money window (admission refused with 402);
    accounts frozen lists it with the permit; unfreeze lifts it and admission works again."""
    b = backend
    permit = await admit(b, "bad-usage")
    invalid = Outcome(kind=OutcomeKind.INVALID, detail="negative tokens")
    await b.gov.settle(permit.id, settlement(permit.request, invalid))
    window = usd_day(permit)
    assert (await b.counter(window))[2] is True
    p = await principal(b.keys, team="t1")
    [refused] = await b.gov.admit([request(p, rid="while-frozen")])
    assert getattr(refused, "status", None) == 402

    frozen = json.loads(b.ok("accounts", "frozen", "--json"))
    assert [(f["counter"], f["frozen_by"]) for f in frozen] == [(window, permit.id)]
    assert window in b.ok("accounts", "frozen")

    assert b.ok("accounts", "unfreeze", window).startswith(f"unfroze {window}")
    # Unfreezing only lifts the freeze: the invalid permit's reservation stays.
    assert await b.counter(window) == (1_000, 0, False)
    assert b.ok("accounts", "frozen").strip() == "no frozen counters"
    assert "is not frozen; nothing changed" in b.ok("accounts", "unfreeze", window)
    unknown = b.mayu("accounts", "unfreeze", "team:nope:usd:day:2026-11-29")
    assert unknown.returncode == 2 and "no such counter" in unknown.stderr
    [admitted] = await b.gov.admit([request(p, rid="after-unfreeze")])
    assert isinstance(admitted, Permit)


def test_every_command_has_help(tmp_path):
    """--help works on both groups and every command; resolve warns about cancelled."""
    b = Backend("local", tmp_path, (), {}, None, None)
    for args in (("permits",), ("permits", "list"), ("permits", "resolve"),
                 ("accounts",), ("accounts", "frozen"), ("accounts", "unfreeze")):
        assert "usage: mayu " + " ".join(args) in b.ok(*args, "--help")
    text = b.ok("permits", "resolve", "--help")
    assert "never reached the provider" in text and "--all-older-than-minutes" in text
    assert "permits" in b.ok("--help") and "accounts" in b.ok("--help")


def test_local_profile_without_a_store_names_the_path(tmp_path):
    """Outside the gateway's directory the CLI refuses instead of creating an empty store."""
    done = Backend("local", tmp_path, (), {}, None, None).mayu("permits", "list")
    assert done.returncode == 2 and "governance_store.path" in done.stderr
    assert not (tmp_path / ".mayu").exists()


async def test_get_permit_rebuilds_the_admitted_request(backend):
    """get_permit returns the permit's charges, bounds and windows as admitted (the
    shared store rebuilds them from permits + permit_segments), and None when unknown."""
    permit = await admit(backend, "rebuild", usd=1_234, tokens=56)
    got = await backend.gov.get_permit(permit.id)
    want, have = permit.request, got.request
    assert (got.id, have.charges, have.token_bound, have.usd_bound, have.day, have.month,
            have.request_id, have.key_id, have.team_id, have.model) == (
        permit.id, want.charges, 56, 1_234, want.day, want.month, "rebuild",
        want.key_id, want.team_id, "m")
    assert await backend.gov.get_permit("0123456789abcdef0123456789abcdef") is None
