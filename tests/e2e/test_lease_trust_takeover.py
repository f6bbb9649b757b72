"""Issue 25's takeover, end to end: real inferplaned with one data-plane token per node,
real Postgres, real ``mayu serve`` planes. A second node's token claiming node-a (raw
heartbeats with a new frame and want = the limit, and a whole ``mayu serve`` configured
as node-a with that token) is refused; node-a keeps serving on its lease and its team
keeps its budget (no adoption, no liability). No timing is asserted: waits poll for a
state (bounded, as hang guards)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e._controlplane import serve_inferplaned
from tests.e2e._lease import (
    ENV,
    LeaseStack,
    budget_doc,
    chat,
    wait_until,
)
from tests.e2e._procs import Proc, start_gateway

pytestmark = pytest.mark.e2e

TEAM = "victims"
UID = "global/spend"
TOKEN_A = "e2e-node-a-dataplane-token"
TOKEN_B = "e2e-node-b-dataplane-token"
LIMIT = 200_000  # µUSD


def start_control(stack: LeaseStack) -> Proc:
    """inferplaned with one data-plane token per node, each bound to its node's id."""
    config = stack.workdir / "inferplaned.yaml"
    config.write_text(yaml.safe_dump({
        "database": {"dsn_ref": "env:IPD_DSN", "pool_min_size": 1, "pool_max_size": 4},
        "auth": {"writer_tokens_ref": {"e2e": "env:IPD_TOKEN"},
                 "dataplane_tokens_ref": {
                     "nodes-a": {"token_ref": "env:TOKEN_A", "planes": ["node-a"]},
                     "nodes-b": {"token_ref": "env:TOKEN_B", "planes": ["node-b"]}}}}))
    proc = serve_inferplaned(config, port=stack.port, log_path=stack.workdir / "inferplaned.log",
                             env={"IPD_DSN": stack.dsn, "TOKEN_A": TOKEN_A, "TOKEN_B": TOKEN_B,
                                  **ENV})
    stack.control = proc
    return proc


@pytest.fixture
def stack(tmp_path: Path, pg_dsn: str) -> Iterator[LeaseStack]:
    s = LeaseStack(workdir=tmp_path, dsn=pg_dsn)
    try:
        start_control(s)
        yield s
    finally:
        s.stop()


def start_plane(stack: LeaseStack, name: str, *, plane_id: str, token: str) -> Proc:
    """``mayu serve`` as ``plane_id`` with ``token`` (its own data dir and key store)."""
    stack.add_plane(name, teams=[TEAM], start=False)
    config = yaml.safe_load(stack.configs[name].read_text())
    config["control_plane"]["dataplane_id"] = plane_id
    stack.configs[name].write_text(yaml.safe_dump(config))
    proc = start_gateway(stack.configs[name], env={**ENV, "MAYU_CP_TOKEN": token})
    stack.planes[name] = proc
    return proc


def test_a_second_nodes_token_cannot_take_over_node_a(stack: LeaseStack) -> None:
    """nodes-b's raw takeover heartbeat (new frame, want = the limit) is 403 and a whole
    plane configured as node-a with nodes-b's token never syncs; node-a keeps serving, its
    ledger row is never adopted and its team's budget holds no liability."""
    stack.publish(budget_doc("global", "*", limit_milli=LIMIT // 1000, grant_milli=20))
    victim = start_plane(stack, "victim", plane_id="node-a", token=TOKEN_A)
    key = stack.keys[("victim", TEAM)]
    wait_until(lambda: chat(victim.url, key).status_code == 200, what="node-a's first lease")
    row = stack.lease_row("node-a", UID)
    assert row is not None
    takeover = {"dataplane": {"id": "node-a", "build": "attacker"}, "frame": "evil",
                "boot": "evil", "seq": 1, "teams": [TEAM],
                "accounts": [{"key": row["account"], "rule_uid": UID, "want": LIMIT}]}
    r = httpx.post(f"{stack.control_url}/v1alpha1/sync", json=takeover,
                   headers={"Authorization": f"Bearer {TOKEN_B}"}, timeout=30)
    assert r.status_code == 403, r.text
    intruder = start_plane(stack, "intruder", plane_id="node-a", token=TOKEN_B)
    wait_until(lambda: "HTTP 403" in intruder.logs(), what="the intruder's refused sync")
    beats = stack.dataplanes()["node-a"]["heartbeats"]
    wait_until(lambda: stack.dataplanes()["node-a"]["heartbeats"] >= beats + 3,
               what="node-a's heartbeats go on")
    for _ in range(5):
        assert chat(victim.url, key).status_code == 200
    plane = stack.dataplanes()["node-a"]
    assert plane["token_name"] == "nodes-a" and plane["frame_changes"] == 0
    (lease,) = [x for x in plane["leases"] if x["rule_uid"] == UID]
    assert lease["frame"] == row["frame"] and lease["adoptions"] == 0
    assert lease["prior_unobserved"] == 0
    account = stack.account(UID)
    assert account["liability"] == 0
    assert account["committed"] + account["leased"] < LIMIT // 2  # the budget is still there
    logs = stack.control.logs() if stack.control else ""
    assert "'nodes-b' may not report for data plane 'node-a'" in logs

