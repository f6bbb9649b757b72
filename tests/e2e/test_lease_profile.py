"""The lease profile end to end (ADR-034): real inferplaned, real Postgres, real planes.

Every plane is a ``mayu serve`` process with its own SQLite stores, syncing with
inferplaned over ``POST /v1alpha1/sync``; the workload goes through ``mayu
mock-upstream``, whose ledger says what was really spent. No timing is asserted: waits
poll for a state (bounded, as hang guards).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e._lease import (
    LeaseStack,
    budget_doc,
    chat,
    lease_stack,
    race,
    start_drop_proxy,
    upstream_spend,
    wait_until,
)
from tests.e2e._procs import Proc, upstream_proc

pytestmark = pytest.mark.e2e

TEAM = "lease-team"
UID = "global/spend"


upstream = upstream_proc  # the fixtures, under this module's names
stack = lease_stack


def drive(stack: LeaseStack, planes: list[str], *, workers: int = 4,
          max_attempts: int = 2_000) -> dict[int, int]:
    """:func:`race` on every plane's key of TEAM until the budget is spent; the statuses."""
    return race([(stack.planes[p].url, stack.keys[(p, TEAM)]) for p in planes],
                workers=workers, max_attempts=max_attempts)


def settled(stack: LeaseStack, planes: list[str]) -> bool:
    """Every plane's ledger row reports exactly the plane's local committed figure."""
    for plane in planes:
        row = stack.lease_row(plane, UID)
        if row is None or row["committed"] != stack.team_usage(plane, TEAM)["usd_committed"]:
            return False
    return True


def test_three_planes_spend_one_global_budget_without_exceeding_it(
        stack: LeaseStack, upstream: Proc) -> None:
    """Three planes, each with its own SQLite, under one global hard budget and a
    concurrent workload: Σ committed never exceeds the limit, matches what the upstream
    served, and the ledger's spend per plane equals that plane's local committed."""
    limit_milli = 20
    stack.publish(budget_doc("global", "*", limit_milli=limit_milli, grant_milli=2))
    planes = ["p1", "p2", "p3"]
    for name in planes:
        stack.add_plane(name, teams=[TEAM], upstream=upstream)
    seen = drive(stack, planes)
    assert seen.get(200, 0) > 0 and seen.get(402, 0) > 0, seen
    wait_until(lambda: settled(stack, planes), what="ledger matches every plane")

    local = [stack.team_usage(p, TEAM)["usd_committed"] for p in planes]
    assert sum(local) <= limit_milli * 1000
    assert sum(local) == upstream_spend(upstream)
    account = stack.account(UID)
    assert account["committed"] == sum(local)
    assert account["committed"] + account["liability"] + account["leased"] <= (
        limit_milli * 1000)
    # All of the budget was spendable but what each plane's lease could not fit: less
    # than one request's bound per plane (no grant stays stranded across renewals).
    bound = stack.largest_bound("p1")
    assert sum(local) > limit_milli * 1000 - len(planes) * bound, (local, seen, bound)


def test_outage_gates_failclosed_caps_and_spares_failopen_rules(
        stack: LeaseStack) -> None:
    """inferplaned killed: once the leases expire the FailClosed hard cap refuses (503)
    while the FailOpen rule keeps serving; restarted, the ledger is intact, no allowance
    is granted twice, and the plane serves the FailClosed team again."""
    stack.publish(budget_doc("closed", "team-closed", limit_milli=10_000, grant_milli=5))
    stack.publish(budget_doc("open", "team-open", limit_milli=10_000, grant_milli=5,
                             failure="FailOpen"))
    stack.add_plane("p1", teams=["team-closed", "team-open"])
    url = stack.planes["p1"].url
    closed, open_ = stack.keys[("p1", "team-closed")], stack.keys[("p1", "team-open")]
    wait_until(lambda: chat(url, closed).status_code == 200, what="first lease granted")
    for _ in range(3):
        assert chat(url, closed).status_code == 200
        assert chat(url, open_).status_code == 200
    wait_until(lambda: (stack.lease_row("p1", "closed/spend") or {}).get("committed") ==
               stack.team_usage("p1", "team-closed")["usd_committed"],
               what="closed account reported")
    before = {uid: stack.lease_row("p1", uid) for uid in ("closed/spend", "open/spend")}
    accounts = {uid: stack.account(uid) for uid in ("closed/spend", "open/spend")}

    stack.stop_control()
    # Until the leases expire the FailClosed team still spends what it holds; the plane
    # reports that spend once inferplaned is back.
    wait_until(lambda: chat(url, closed).status_code == 503, what="FailClosed gated")
    refused = chat(url, closed)
    assert refused.status_code == 503 and "expired" in refused.json()["error"]["message"]
    for _ in range(3):
        assert chat(url, open_).status_code == 200  # FailOpen keeps serving
    # With inferplaned down nothing reaches the ledger (its Postgres is still up).
    assert stack.account("closed/spend") == accounts["closed/spend"]

    stack.start_control()
    # Nothing lost in the restart: the ledger only grows, by what the plane reports on
    # its first heartbeat (which may already have come in).
    for uid, old_account in accounts.items():
        assert stack.account(uid)["committed"] >= old_account["committed"]
    wait_until(lambda: chat(url, closed).status_code == 200, what="plane resumed")
    wait_until(lambda: (stack.lease_row("p1", "open/spend") or {}).get("committed") ==
               stack.team_usage("p1", "team-open")["usd_committed"],
               what="outage spend reported")
    for uid, old in before.items():
        row = stack.lease_row("p1", uid)
        assert row is not None and old is not None
        assert row["frame"] == old["frame"] and row["adoptions"] == 0
        # Cumulative: the allowance only ever grows by one grant beyond what is held.
        held = row["committed"] + row["liability"] + row["reserved"]
        assert held <= row["allowance"] <= max(old["allowance"], held + 5_000)
        account = stack.account(uid)
        assert account["committed"] == row["committed"]
        assert account["leased"] == row["allowance"] - row["committed"] - row["liability"]


def test_a_plane_back_with_empty_counters_never_respends_its_old_allowance(
        stack: LeaseStack, upstream: Proc) -> None:
    """A plane restarted with a wiped counter store comes back in a new frame: the
    ledger keeps its old spend, counts the rest of its old allowance as unobserved, and
    what the plane spends afterwards fits in what the budget had left."""
    limit = 20_000
    stack.publish(budget_doc("global", "*", limit_milli=limit // 1000, grant_milli=8))
    stack.add_plane("p1", teams=[TEAM], upstream=upstream, separate_counters=True)
    url, key = stack.planes["p1"].url, stack.keys[("p1", TEAM)]
    wait_until(lambda: chat(url, key).status_code == 200, what="first lease granted")
    for _ in range(4):
        assert chat(url, key).status_code == 200
    wait_until(lambda: settled(stack, ["p1"]), what="first frame reported")
    old = stack.lease_row("p1", UID)
    assert old is not None and old["allowance"] > old["committed"] > 0
    first_spend = upstream_spend(upstream)

    stack.stop_plane("p1")
    (stack.workdir / "p1" / "counters.db").unlink()
    for suffix in ("-wal", "-shm"):
        (stack.workdir / "p1" / f"counters.db{suffix}").unlink(missing_ok=True)
    stack.start_plane("p1")
    drive(stack, ["p1"], workers=2)
    wait_until(lambda: settled(stack, ["p1"]), what="new frame reported")
    row = stack.lease_row("p1", UID)
    assert row is not None
    assert row["frame"] != old["frame"] and row["adoptions"] == 1
    assert row["prior_committed"] == old["committed"]
    assert row["prior_unobserved"] == old["allowance"] - old["committed"]
    second_spend = upstream_spend(upstream) - first_spend
    assert second_spend == row["committed"]
    assert second_spend <= limit - old["allowance"]  # the old allowance stayed spent
    account = stack.account(UID)
    assert account["committed"] == first_spend + second_spend
    assert account["committed"] + account["liability"] + account["leased"] <= limit


def test_an_answer_lost_after_the_ledger_committed_is_retried_without_a_double_grant(
        stack: LeaseStack, tmp_path: Path) -> None:
    """The control plane commits a heartbeat whose answer never reaches the plane; the
    plane's retry (same figures) gets the same allowance, and the account binds no more
    (an idle plane's release included: the lost answer leaves its lease frozen)."""
    stack.publish(budget_doc("global", "*", limit_milli=10_000, grant_milli=5))
    proxy, port, flag = start_drop_proxy(tmp_path, stack.port)
    try:
        stack.add_plane("p1", teams=[TEAM], control_url=f"http://127.0.0.1:{port}")
        url, key = stack.planes["p1"].url, stack.keys[("p1", TEAM)]
        wait_until(lambda: chat(url, key).status_code == 200, what="first lease granted")
        wait_until(lambda: settled(stack, ["p1"]), what="spend reported")

        def released() -> bool:  # idle: the plane returned its headroom (a steady state)
            row = stack.lease_row("p1", UID) or {}
            return row.get("allowance") == row.get("committed")

        wait_until(released, what="the idle plane's headroom returned")
        before, account = stack.lease_row("p1", UID), stack.account(UID)
        beats = stack.dataplanes()["p1"]["heartbeats"]
        flag.touch()
        wait_until(lambda: not flag.exists(), what="one answer dropped")
        wait_until(lambda: stack.dataplanes()["p1"]["heartbeats"] >= beats + 2,
                   what="the retry after the lost answer")
        assert "policy refresh failed: lease sync" in stack.planes["p1"].logs()
        after = stack.lease_row("p1", UID)
        assert before is not None and after is not None
        stamps = ("expires_at", "updated_at")
        assert {k: v for k, v in after.items() if k not in stamps} == {
            k: v for k, v in before.items() if k not in stamps}
        assert stack.account(UID) == account
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
