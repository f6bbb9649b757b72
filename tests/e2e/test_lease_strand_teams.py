"""Issue 25, item 2, end to end: a lease plane is granted budget only for the teams its
key store has. A rule naming team x parks none of x's budget on a plane without x; when
x is created on that plane later, its first request triggers an early heartbeat, which
brings the lease, and is admitted once that answer is in (one round trip). Real
inferplaned, Postgres and ``mayu serve``; waits poll for a state (bounded, as hang
guards), no timing is asserted."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from tests.e2e._lease import LeaseStack, budget_doc, chat, lease_stack, wait_until

pytestmark = pytest.mark.e2e


stack = lease_stack  # the fixture, under this module's name


def accounts_of(dsn: str, uid: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT a.key, g.dataplane, g.allowance FROM authority_accounts a"
                            " LEFT JOIN lease_grants g ON g.account = a.key"
                            " WHERE a.rule_uid = %s ORDER BY a.key", (uid,)).fetchall()


def test_a_plane_without_team_x_holds_none_of_xs_budget(stack: LeaseStack) -> None:
    """Team x's budget is not leased to a plane whose key store has only team alpha; once
    x is created there, x's first request asks for the lease and is admitted with it."""
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
    started = time.monotonic()
    first = chat(plane.url, key)
    print(f"x's first request: {first.status_code} after {time.monotonic() - started:.2f}s")
    assert first.status_code == 200, first.text  # its lease came within one round trip
    ((account, dataplane, allowance),) = accounts_of(stack.dsn, "xs/spend")
    assert dataplane == "p1" and "team=x" in account and allowance > 0
