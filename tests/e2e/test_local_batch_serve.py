"""Shared SQLite transactions in a real gateway: the limit holds, each permit settles once.

``mayu serve`` (local profile, batching on by default) in front of ``mayu mock-upstream``:
many concurrent requests on one team with a small day budget, some streamed, while a
reader polls ``/v1/usage`` (its reads take the store's connection in a worker thread, so
batches also go the worker-thread way). The mock's own ledger says what each admitted
request really cost; the SQLite file says what was admitted and settled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e._load import load_watching_usage, local_permits, one_chat
from tests.e2e._procs import Proc, create_key, create_team, free_port, start, wait_ready
from tests.e2e._procs import start_mock_upstream as mock_upstream
from tests.e2e.conftest import ADMIN_TOKEN, expected_cost, gateway_config

pytestmark = pytest.mark.e2e

LIMIT = 8_000  # µUSD per day: a few dozen of these requests fit, not all
WORKERS, EACH = 40, 6  # 40 clients, each sending its requests one after the other
N = WORKERS * EACH


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[Proc, Proc, Path]]:
    upstream = mock_upstream(tmp_path)
    config = gateway_config(tmp_path, upstream)
    port = free_port()
    try:
        # --log-level info: the store says at shutdown how many transactions it took.
        gw = wait_ready(start(["serve", "--config", str(config), "--port", str(port),
                               "--log-level", "info"], port=port,
                              log_path=tmp_path / "gateway.log",
                              env={"MAYU_E2E_ADMIN_TOKEN": ADMIN_TOKEN}))
    except BaseException:
        upstream.stop()
        raise
    try:
        yield gw, upstream, config
    finally:
        gw.stop()
        upstream.stop()


def test_batched_store_never_overshoots_and_settles_every_permit_once(gateway) -> None:
    """40 concurrent clients sending 6 calls each (a third streamed) on a small day
    budget, /v1/usage polled all along: committed + reserved never exceeds the limit at
    any observation, every refusal is a 402, every admitted request has exactly one
    permit settled exactly once at what the upstream's ledger says it cost, nothing
    stays pending, and the store took fewer transactions than operations."""
    gw, upstream, config = gateway
    create_team(config, "batch", "--usd-micros-per-day", str(LIMIT))
    key = create_key(config, "batch")
    results, observed = load_watching_usage(gw.url, key, one_chat, clients=WORKERS, each=EACH)
    admitted = [r for r in results if r["status"] == 200]
    refused = [r for r in results if r["status"] != 200]
    assert admitted and refused, "the limit should admit some and refuse others"
    for r in refused:
        assert r["status"] == 402, r
        assert json.loads(r["body"])["error"]["type"] == "insufficient_quota", r
    assert observed and max(observed) <= LIMIT

    ledger = {e["id"]: e for e in httpx.get(f"{upstream.url}/__mock/ledger").json()}
    assert len(ledger) == len(admitted)
    assert sorted(r["mock"] for r in admitted) == sorted(ledger)
    settled = local_permits(config.parent / "data" / "mayu.db", "batch", len(admitted))
    assert len(settled) == len(admitted)  # one permit per admitted request, no other
    for r in admitted:
        row = settled[r["permit"]]
        entry = ledger[r["mock"]]
        assert row["status"] == "settled" and row["kind"] == "complete", row
        assert row["usd_committed"] == expected_cost(entry)
        assert row["tokens_committed"] == sum(entry["classes"].values())
        assert row["settlements"] == 1
    assert sum(row["usd_committed"] for row in settled.values()) <= LIMIT

    gw.stop()
    ops, transactions = _batching(gw.logs())
    assert ops >= N + len(admitted)  # every admission and every settlement
    assert transactions < ops





def _batching(log: str) -> tuple[int, int]:
    found = re.search(r"(\d+) admissions and settlements in (\d+) transactions", log)
    assert found, log[-2000:]
    return int(found.group(1)), int(found.group(2))
