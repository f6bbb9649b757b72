"""SIGTERM with streams still open at ``server.shutdown_grace_s``: each stream the drain
deadline cuts is settled once, by its own relay (what it relayed observed, the rest of
the bound liability, detail "cut at shutdown"), and the audit file says what the store
holds. The Governor's shutdown settlement used to race the cancelled relays: the store
kept its uncertain whole bound, the audit a "client disconnected" line the store then
refused with an ERROR.
"""

from __future__ import annotations

import signal
import socket
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.governance import (
    Governor,
    LocalGovernanceStore,
    Outcome,
    OutcomeKind,
    build_request,
    settlement_for,
)
from gateway.keys import KeyLimits, Principal, Team, TeamLimits
from gateway.policy import EMPTY_SNAPSHOT
from gateway.pricing import ModelPrice
from tests.e2e.test_disconnect_fast_upstream import (
    FastUpstream,
    fast_gateway,
    open_stream,
    read_head,
    settled_lines,
)

pytestmark = pytest.mark.e2e

_FIGURES = ("tokens_committed", "usd_committed", "tokens_liability", "usd_liability")
PRICE = ModelPrice(input=1_000_000, output=4_000_000)


@pytest.fixture
def upstream() -> Iterator[FastUpstream]:
    up = FastUpstream()
    try:
        yield up
    finally:
        up.close()


def test_streams_cut_at_the_drain_deadline_are_settled_once(
        tmp_path: Path, upstream: FastUpstream) -> None:
    """Three unread streams past a 1 s grace: one settled audit line each ("cut at
    shutdown", the relayed output committed), equal to the store's settlement, and no
    settlement refused by the store."""
    gateway, key = fast_gateway(tmp_path, upstream, shutdown_grace_s=1)
    socks: list[socket.socket] = []
    try:
        permits = []
        for _ in range(3):
            socks.append(open_stream(gateway.port, key))
            permits.append(read_head(socks[-1]))
        gateway.popen.send_signal(signal.SIGTERM)
        assert gateway.popen.wait(60) == -signal.SIGTERM, gateway.logs()
    finally:
        for sock in socks:
            sock.close()
        gateway.stop()
    data = tmp_path / "data"
    lines = settled_lines(data)
    with sqlite3.connect(data / "mayu.db") as db:
        db.row_factory = sqlite3.Row
        rows = {row["permit_id"]: row for row in db.execute(
            "SELECT * FROM gov_settlements WHERE permit_id IN (?, ?, ?)", permits)}
    assert "refused" not in gateway.logs(), gateway.logs()
    for permit in permits:
        [line] = [rec for rec in lines if rec["permit"] == permit]
        row = rows[permit]
        assert line["detail"] == row["detail"] == "cut at shutdown", (line, dict(row))
        assert line["outcome"] == row["kind"] == "uncertain", (line, dict(row))
        assert {f: line[f] for f in _FIGURES} == {f: row[f] for f in _FIGURES}, (
            line, dict(row))
        assert 0 < line["tokens_committed"] < line["token_bound"], line
        assert line["tokens_committed"] + line["tokens_liability"] == line["token_bound"]


async def test_a_report_after_the_shutdown_settlement_is_not_sent(tmp_path: Path) -> None:
    """A permit still open when Governor.close stops waiting is settled there, once: its
    request's later report gets that settlement back and is never sent to the store.
    (In-process, on a real SQLite store: the moment a real request misses is not one a
    process can be made to miss on purpose.)"""
    store = LocalGovernanceStore(str(tmp_path / "mayu.db"))
    await store.open()
    sent: list[str] = []
    governor = Governor(store, on_settled=lambda permit, s, *_: sent.append(s.detail))
    await governor.start()
    p = Principal(key_id="key_1", key_prefix="sk-inf-abcdef", key_revision=1,
                  key_limits=KeyLimits(), allowed_models=None, user=None,
                  team=Team(id="team_1", name="one", limits=TeamLimits()))

    permit = await governor.admit_plan(build_request(
        p, EMPTY_SNAPSHOT, request_id="r1", model="m", token_bound=100, usd_bound=1_000,
        now=datetime.now(UTC)))
    await governor.close(own_s=0.05)
    cut = Outcome(kind=OutcomeKind.UNCERTAIN, detail="cut at shutdown", output_floor=5)
    late = governor.settlement(permit, cut, PRICE)
    assert late.detail == "gateway shut down before the outcome was observed"
    assert await governor.settle(permit, settlement_for(permit.request, cut, PRICE)) is None
    await store.close()
    assert sent == [late.detail]
    with sqlite3.connect(tmp_path / "mayu.db") as db:
        rows = db.execute("SELECT detail, tokens_committed, tokens_liability "
                          "FROM gov_settlements").fetchall()
    assert rows == [(late.detail, 0, 100)]
