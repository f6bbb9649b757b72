"""Many concurrent requests against one small budget: the limit holds exactly."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Stack, expected_cost

pytestmark = pytest.mark.e2e

LIMIT = 6_000  # µUSD per day: room for a couple of dozen of these requests, not 200
N = 200


async def _one(client: httpx.AsyncClient, i: int) -> tuple[int, dict[str, Any] | None]:
    body = {"model": "gpt-up", "max_tokens": 16 + i % 5,
            "messages": [{"role": "user", "content": f"request number {i} " * (1 + i % 3)}]}
    if i % 4 == 0:  # a quarter stream: settled when their stream ends
        body["stream"] = True
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            await r.aread()
        return r.status_code, (r.json() if r.status_code != 200 else None)
    r = await client.post("/v1/chat/completions", json=body)
    return r.status_code, (r.json() if r.status_code != 200 else None)


def test_concurrent_requests_never_overshoot_and_settle_to_the_ledger(stack: Stack) -> None:
    """200 concurrent calls on a small day limit: committed <= limit, committed + reserved
    == what the upstream reported for the admitted calls, nothing left reserved, and every
    refusal is a 402 in the OpenAI error shape."""
    key = stack.team_key("budget", "--usd-micros-per-day", str(LIMIT))
    stack.clear_ledger()

    async def run() -> list[tuple[int, dict[str, Any] | None]]:
        limits = httpx.Limits(max_connections=N, max_keepalive_connections=N)
        async with httpx.AsyncClient(base_url=stack.gateway.url, limits=limits, timeout=120,
                                     headers={"Authorization": f"Bearer {key}"}) as client:
            return await asyncio.gather(*(_one(client, i) for i in range(N)))

    results = asyncio.run(run())
    admitted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] != 200]
    assert admitted and refused, "the limit should admit some and refuse others"
    for status, body in refused:
        assert status == 402, body
        assert body is not None and body["error"]["type"] == "insufficient_quota"
        assert set(body["error"]) == {"message", "type", "param", "code"}

    ledger = stack.ledger()
    assert len(ledger) == len(admitted)
    reported = sum(expected_cost(e) for e in ledger)
    reported_tokens = sum(sum(e["classes"].values()) for e in ledger)
    usage = stack.team_usage(key)
    assert usage["usd_committed"] <= LIMIT
    assert usage["usd_committed"] + usage["usd_reserved"] == reported
    assert usage["usd_reserved"] == 0 and usage["tokens_reserved"] == 0
    assert usage["tokens_committed"] == reported_tokens
    assert usage["requests"] == len(admitted)
