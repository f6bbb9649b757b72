"""The lease profile beside the shared profile on one database (real processes).

A shared-profile gateway admits against ``authority_accounts`` in Postgres; lease-profile
planes get leases from the ledger kept in the same rows. One policy budget is therefore
one budget for both, and a document a lease plane cannot enforce is rejected there only:
the shared gateway, which can, enforces it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.e2e._controlplane import MODEL as SHARED_MODEL
from tests.e2e._controlplane import shared_gateway_config
from tests.e2e._lease import (
    LeaseStack,
    budget_doc,
    chat,
    lease_stack,
    shared_key,
    wait_until,
)
from tests.e2e._procs import Proc, start_gateway, wait_none_pending

pytestmark = pytest.mark.e2e

TEAM = "mixed"


stack = lease_stack  # the fixture, under this module's name


@pytest.fixture
def shared(tmp_path: Path, pg_dsn: str) -> Iterator[tuple[Proc, Path]]:
    config = shared_gateway_config(tmp_path, "shared")
    proc = start_gateway(config, env={"INFERPLANE_DATABASE_URL": pg_dsn})
    try:
        yield proc, config
    finally:
        proc.stop()


def shared_chat(url: str, key: str, client: httpx.Client | None = None) -> httpx.Response:
    body = {"model": SHARED_MODEL, "max_tokens": 50,
            "messages": [{"role": "user", "content": "hello there"}]}
    post = client.post if client is not None else httpx.post
    return post(f"{url}/v1/chat/completions", json=body,
                headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_shared_admissions_and_leases_never_exceed_one_budget_together(
        stack: LeaseStack, shared: tuple[Proc, Path], pg_dsn: str) -> None:
    """A shared-profile gateway and two lease planes spend one policy budget
    concurrently: together they never pass it, and the account holds exactly what each
    committed."""
    limit = 40_000
    stack.publish(budget_doc("global", "*", limit_milli=limit // 1000, grant_milli=3))
    gateway, config = shared
    skey = shared_key(config, pg_dsn, TEAM)
    for name in ("p1", "p2"):
        stack.add_plane(name, teams=[TEAM])
    calls: list[tuple[str, Any]] = [(stack.planes[p].url, stack.keys[(p, TEAM)])
                                    for p in ("p1", "p2")]

    def work(send: Any) -> None:
        refused = 0
        with httpx.Client() as client:
            for _ in range(2_000):
                status = send(client).status_code
                refused = refused + 1 if status == 402 else 0
                if refused >= 10:
                    return
                if status == 402:
                    time.sleep(0.1)

    senders = [lambda c, u=u, k=k: chat(u, k, client=c) for u, k in calls]
    senders.append(lambda c: shared_chat(gateway.url, skey, c))
    for send in senders:  # every gateway serves before the race starts
        wait_until(lambda send=send: send(None).status_code == 200, what="first answer")
    threads = [threading.Thread(target=work, args=(s,)) for s in senders for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def planes_committed() -> int:
        return sum(stack.team_usage(p, TEAM)["usd_committed"] for p in ("p1", "p2"))

    def ledger_caught_up() -> bool:
        rows = [stack.lease_row(p, "global/spend") for p in ("p1", "p2")]
        return all(r is not None for r in rows) and sum(
            r["committed"] for r in rows if r) == planes_committed()

    wait_until(ledger_caught_up, what="both planes reported")
    # The shared gateway's answers left before its store took their settlements.
    wait_none_pending(pg_dsn)
    with psycopg.connect(pg_dsn) as conn:
        # The shared gateway's own permits (the planes' shipped records carry a plane).
        row = conn.execute("SELECT coalesce(sum(usd_committed), 0) FROM permits"
                           " WHERE status <> 'pending' AND plane IS NULL").fetchone()
    assert row is not None
    shared_committed = int(row[0])
    account = stack.account("global/spend")
    assert shared_committed > 0 and planes_committed() > 0
    assert account["committed"] == shared_committed + planes_committed()
    assert account["committed"] <= limit
    assert account["committed"] + account["liability"] + account["reserved"] + (
        account["leased"]) <= limit


def test_a_document_a_lease_plane_cannot_enforce_is_rejected_there_only(
        stack: LeaseStack, shared: tuple[Proc, Path], pg_dsn: str) -> None:
    """A tokenQuota document is rejected by the lease plane (listed in
    /v1alpha1/dataplanes, its FailClosed rule refusing the team it covers) while the
    plane applies the other documents, and the shared gateway enforces the quota."""
    stack.publish(budget_doc("tiny", "alpha", limit_milli=1))
    stack.publish({"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
                   "metadata": {"name": "quota"},
                   "spec": {"rules": [{"name": "tokens", "failurePolicy": "FailClosed",
                                       "subject": {"kind": "team", "team": "beta"},
                                       "tokenQuota": {"day": 10}}]}})
    stack.add_plane("p1", teams=["alpha", "beta", "gamma"])
    url = stack.planes["p1"].url
    wait_until(lambda: bool((stack.dataplanes().get("p1") or {}).get("rejections")),
               what="rejection reported")
    (rejection,) = stack.dataplanes()["p1"]["rejections"]
    assert rejection["name"] == "quota"
    assert rejection["problems"][0]["path"] == "spec.rules[0].tokenQuota"
    assert stack.applied_generation("p1") == 2

    wait_until(lambda: chat(url, stack.keys[("p1", "alpha")]).status_code == 402,
               what="the other document applies")
    beta = chat(url, stack.keys[("p1", "beta")])
    assert beta.status_code == 503
    assert "quota/tokens" in beta.json()["error"]["message"]
    assert chat(url, stack.keys[("p1", "gamma")]).status_code == 200

    gateway, config = shared
    refused = shared_chat(gateway.url, shared_key(config, pg_dsn, "beta"))
    assert refused.status_code == 429  # the shared profile enforces the quota itself
