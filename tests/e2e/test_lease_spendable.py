"""Issue 25, end to end: a small budget leased to several planes is spendable, and
parks nowhere it cannot be spent.

Real inferplaned on Postgres, three ``mayu serve`` lease planes and a shared-profile
gateway on the same database, all in front of one ``mayu mock-upstream`` whose own
ledger says what was really served. A fourth plane has no key of the budget's team.
Waits poll for a state (bounded, as hang guards); no timing is asserted. It takes 12 s
on the 2-core machine when quiet, up to about 30 s when it is shared: seven processes
and eight CLI runs (teams, keys) start one after another, and the race ends only once
every client has been refused 402 ten times in a row, 0.1 s apart (what tells "spent"
from "in flight elsewhere").
"""

from __future__ import annotations

import psycopg
import pytest

from tests.e2e._lease import (
    LeaseStack,
    budget_doc,
    chat,
    lease_stack,
    race,
    shared_key,
    start_shared,
    upstream_spend,
    wait_until,
)
from tests.e2e._procs import Proc, upstream_proc, wait_none_pending

pytestmark = pytest.mark.e2e

TEAM = "x"
UID = "small/spend"
PLANES = ("p1", "p2", "p3")


upstream = upstream_proc  # the fixtures, under this module's names
stack = lease_stack


def grant_rows(dsn: str, plane: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT account, allowance FROM lease_grants"
                            " WHERE dataplane = %s AND rule_uid = %s", (plane, UID)).fetchall()


def test_ten_bounds_of_budget_are_spent_to_the_last_request_across_planes_and_shared(
        stack: LeaseStack, upstream: Proc, pg_dsn: str) -> None:
    """A budget of 10 request bounds, spent concurrently by 3 planes and a shared gateway:
    what the upstream served is at least 90 % of it and never more than 100 %, equals the
    account's committed figure, and a plane without team x holds none of x's budget."""
    for name in PLANES:
        stack.add_plane(name, teams=[TEAM, "probe"] if name == "p1" else [TEAM],
                        upstream=upstream)
    stack.add_plane("p4", teams=["other"], upstream=upstream)
    # One request of a team without a budget gives the bound of every request.
    assert chat(stack.planes["p1"].url, stack.keys[("p1", "probe")]).status_code == 200
    bound = stack.largest_bound("p1")
    probe_spend = upstream_spend(upstream)
    limit_milli = -(-10 * bound // 1000)
    limit = limit_milli * 1000
    assert limit < 11 * bound  # about 10 bounds: milliUSD granularity
    stack.publish(budget_doc("small", TEAM, limit_milli=limit_milli, grant_milli=1))
    shared, config = start_shared(stack.workdir, pg_dsn, upstream=upstream)
    try:
        targets = [(stack.planes[p].url, stack.keys[(p, TEAM)]) for p in PLANES]
        targets.append((shared.url, shared_key(config, pg_dsn, TEAM)))
        wait_until(lambda: all(stack.applied_generation(p) == 1 for p in (*PLANES, "p4")),
                   what="the budget applied on every plane")
        seen = race(targets, workers=3)
        wait_none_pending(pg_dsn)
    finally:
        shared.stop()

    def reported() -> bool:
        rows = [stack.lease_row(p, UID) for p in PLANES]
        return all(r is not None and r["committed"] ==
                   stack.team_usage(p, TEAM)["usd_committed"] and r["reserved"] == 0
                   for p, r in zip(PLANES, rows, strict=True))

    wait_until(reported, what="every plane reported its final figures")
    spent = upstream_spend(upstream) - probe_spend
    account = stack.account(UID)
    print(f"bound {bound} µUSD, limit {limit}: spent {spent} ({100 * spent / limit:.1f} %),"
          f" statuses {seen}")
    assert spent <= limit
    assert spent >= 0.9 * limit, (spent, limit, seen)
    assert account["committed"] == spent
    assert account["committed"] + account["liability"] + account["reserved"] + (
        account["leased"]) <= limit
    assert grant_rows(pg_dsn, "p4") == []
    assert stack.lease_row("p4", UID) is None
