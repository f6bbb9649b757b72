"""Shared SQLite transactions in a real gateway: the limit holds, each permit settles once.

``mayu serve`` (local profile, batching on by default) in front of ``mayu mock-upstream``:
many concurrent requests on one team with a small day budget, some streamed, while a
reader polls ``/v1/usage`` (its reads take the store's connection in a worker thread, so
batches also go the worker-thread way). The mock's own ledger says what each admitted
request really cost; the SQLite file says what was admitted and settled.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

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


async def _one(client: httpx.AsyncClient, i: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gpt-up", "max_tokens": 16 + i % 7,
        "messages": [{"role": "user", "content": f"request {i} " * (1 + i % 4)}]}
    if i % 3 == 0:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            text = (await r.aread()).decode()
        found = re.search(r'"id":"chatcmpl-mock-(\d+)"', text)
    else:
        r = await client.post("/v1/chat/completions", json=body)
        text = r.text
        found = re.search(r'"id":"chatcmpl-mock-(\d+)"', text) if r.status_code == 200 else None
    return {"status": r.status_code, "permit": r.headers.get("x-inferplane-permit"),
            "mock": int(found.group(1)) if found else None,
            "body": None if r.status_code == 200 else json.loads(text)}


def test_batched_store_never_overshoots_and_settles_every_permit_once(gateway) -> None:
    """40 concurrent clients sending 6 calls each (a third streamed) on a small day
    budget, /v1/usage polled all along: committed + reserved never exceeds the limit at
    any observation, every refusal is a 402, every admitted request has exactly one
    permit settled exactly once at what the upstream's ledger says it cost, nothing
    stays pending, and the store took fewer transactions than operations."""
    gw, upstream, config = gateway
    create_team(config, "batch", "--usd-micros-per-day", str(LIMIT))
    key = create_key(config, "batch")
    headers = {"Authorization": f"Bearer {key}"}
    observed: list[int] = []

    async def run() -> list[dict[str, Any]]:
        limits = httpx.Limits(max_connections=N, max_keepalive_connections=N)
        async with httpx.AsyncClient(base_url=gw.url, limits=limits, timeout=120,
                                     headers=headers) as client:
            done = asyncio.Event()

            async def watch() -> None:
                while not done.is_set():
                    r = await client.get("/v1/usage")
                    for row in r.json()["data"]:  # absent until the first charge
                        if (row["scope"], row["window"]) == ("team", "day"):
                            observed.append(row["usd_committed"] + row["usd_reserved"]
                                            + row["usd_liability"])
                    await asyncio.sleep(0.005)
            watcher = asyncio.ensure_future(watch())
            async def worker(w: int) -> list[dict[str, Any]]:
                return [await _one(client, w * EACH + j) for j in range(EACH)]
            try:
                done_by = await asyncio.gather(*(worker(w) for w in range(WORKERS)))
                return [r for rs in done_by for r in rs]
            finally:
                done.set()
                await watcher

    results = asyncio.run(run())
    admitted = [r for r in results if r["status"] == 200]
    refused = [r for r in results if r["status"] != 200]
    assert admitted and refused, "the limit should admit some and refuse others"
    for r in refused:
        assert r["status"] == 402 and r["body"]["error"]["type"] == "insufficient_quota", r
    assert observed and max(observed) <= LIMIT

    ledger = {e["id"]: e for e in httpx.get(f"{upstream.url}/__mock/ledger").json()}
    assert len(ledger) == len(admitted)
    assert sorted(r["mock"] for r in admitted) == sorted(ledger)
    settled = _settled_rows(config.parent / "data" / "mayu.db", len(admitted))
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


def _settled_rows(db: Path, expected: int) -> dict[str, dict[str, Any]]:
    """The team's permits with their settlements, once none is pending (a stream's
    settlement may follow its last byte)."""
    end = time.monotonic() + 60
    while True:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            rows = conn.execute(
                "SELECT p.id, p.status, s.kind, s.usd_committed, s.tokens_committed,"
                " (SELECT count(*) FROM gov_settlements x WHERE x.permit_id = p.id)"
                " AS settlements FROM gov_permits p JOIN teams t ON t.id = p.team_id"
                " LEFT JOIN gov_settlements s ON s.permit_id = p.id"
                " WHERE t.name = 'batch'").fetchall()
        finally:
            conn.close()
        pending = [r for r in rows if r["status"] == "pending"]
        if (not pending and len(rows) >= expected) or time.monotonic() > end:
            return {r["id"]: dict(r) for r in rows}
        time.sleep(0.1)


def _batching(log: str) -> tuple[int, int]:
    found = re.search(r"(\d+) admissions and settlements in (\d+) transactions", log)
    assert found, log[-2000:]
    return int(found.group(1)), int(found.group(2))
