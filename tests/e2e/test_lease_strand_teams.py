"""Issue 25, item 2, end to end: a lease plane is granted budget only for the teams its
key store has. A rule naming team x parks none of x's budget on a plane without x; when
x is created on that plane later, its first request gets ``lease_missing`` and the early
heartbeat it triggers brings the lease. Real inferplaned, Postgres and ``mayu serve``;
waits poll for a state (bounded, as hang guards), no timing is asserted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.e2e._lease import LeaseStack, budget_doc, chat, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def stack(tmp_path: Path, pg_dsn: str) -> Iterator[LeaseStack]:
    s = LeaseStack(workdir=tmp_path, dsn=pg_dsn)
    try:
        s.start_control()
        yield s
    finally:
        s.stop()


def accounts_of(dsn: str, uid: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT a.key, g.dataplane, g.allowance FROM authority_accounts a"
                            " LEFT JOIN lease_grants g ON g.account = a.key"
                            " WHERE a.rule_uid = %s ORDER BY a.key", (uid,)).fetchall()


def test_a_plane_without_team_x_holds_none_of_xs_budget(stack: LeaseStack) -> None:
    """Team x's budget is not leased to a plane whose key store has only team alpha; once
    x is created there, x's first request asks for the lease and a retry is admitted."""
    stack.publish(budget_doc("xs", "x", limit_milli=100, grant_milli=10))
    stack.publish(budget_doc("alphas", "alpha", limit_milli=100, grant_milli=10))
    plane = stack.add_plane("p1", teams=["alpha"])
    assert plane is not None
    wait_until(lambda: stack.lease_row("p1", "alphas/spend") is not None,
               what="alpha's lease (leased before its first request)")
    beats = stack.dataplanes()["p1"]["heartbeats"]
    wait_until(lambda: stack.dataplanes()["p1"]["heartbeats"] >= beats + 3,
               what="three more heartbeats")
    assert stack.lease_row("p1", "xs/spend") is None
    assert accounts_of(stack.dsn, "xs/spend") == []

    key = stack.create_key("p1", "x")
    first = chat(plane.url, key)
    assert first.status_code == 503 and "lease" in first.text
    started, tries = time.monotonic(), 0

    def admitted() -> bool:
        nonlocal tries
        tries += 1
        return chat(plane.url, key).status_code == 200

    wait_until(admitted, what="x's first request admitted after its lease arrived")
    print(f"x's first lease: admitted after {time.monotonic() - started:.2f}s, {tries} tries")
    ((account, dataplane, allowance),) = accounts_of(stack.dsn, "xs/spend")
    assert dataplane == "p1" and "team=x" in account and allowance > 0
