"""A user-scoped budget account (``kind: user`` and ``team-user`` rules charge
``team=<team>,user=<user>``) is leased on its first request, end to end: the request
triggers an early heartbeat, which brings the lease, and is admitted once that answer is
in (before
issue 25 the control plane ignored every such account, so a FailClosed user budget
refused its users for good). Real inferplaned, Postgres and ``mayu serve``; waits poll
for a state (bounded, as hang guards), no timing is asserted."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e._lease import ENV, LeaseStack, chat, lease_stack, wait_until
from tests.e2e._procs import run_cli

pytestmark = pytest.mark.e2e


stack = lease_stack  # the fixture, under this module's name


def test_a_users_first_request_gets_its_lease(stack: LeaseStack) -> None:
    """alice's first request waits for the early heartbeat it triggered and is admitted
    on the lease it brought; the ledger row names team=t,user=alice."""
    stack.publish({"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
                   "metadata": {"name": "users"},
                   "spec": {"rules": [{"name": "per-user", "failurePolicy": "FailClosed",
                                       "subject": {"kind": "user", "user": "*"},
                                       "budget": {"limitMilliUSD": 100, "window": "day",
                                                  "lease": {"grant": 10,
                                                            "renewInterval": "1s"}}}]}})
    plane = stack.add_plane("p1", teams=["t"])
    assert plane is not None
    wait_until(lambda: stack.applied_generation("p1") == 1, what="the policy applied")
    done = run_cli("keys", "create", "--team", "t", "--user", "alice", "--config",
                   str(stack.configs["p1"]), "--json", env=ENV)
    assert done.returncode == 0, done.stderr
    key = json.loads(done.stdout)["key"]
    started = time.monotonic()
    first = chat(plane.url, key)
    print(f"alice's first request: {first.status_code} after "
          f"{time.monotonic() - started:.2f}s")
    assert first.status_code == 200, first.text  # her lease came within one round trip
    row = stack.lease_row("p1", "users/per-user")
    assert row is not None and ":team=t,user=alice:" in row["account"]
