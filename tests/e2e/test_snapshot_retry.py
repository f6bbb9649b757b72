"""A request that straddles a policy publish is re-planned, not refused (shared profile).

Real processes: inferplaned and two ``mayu serve`` gateways on one migrated database,
called concurrently with the real ``openai`` SDK (no client retries) while the test
publishes and deletes a policy generation after generation. The gateways must absorb the
snapshot mismatches (re-authenticate, re-capture the generation, re-admit), so no 503
reaches a client, and every permit must have been admitted under exactly one generation
that existed: its recorded generation is a published one, and it charged the policy
account exactly when that generation carried the policy (never a mix).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import openai
import psycopg
import pytest

from tests.e2e._controlplane import MODEL, WRITER_TOKEN, SharedStack, budget_policy

pytestmark = pytest.mark.e2e

WORKERS = 8
PUBLISHES = 30


@pytest.fixture
def shared(two_gateways: SharedStack) -> SharedStack:
    return two_gateways


async def _worker(client: openai.AsyncOpenAI, stop: asyncio.Event,
                  statuses: Counter[int]) -> None:
    while not stop.is_set():
        try:
            await client.chat.completions.create(
                model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
            statuses[200] += 1
        except openai.APIStatusError as exc:
            statuses[exc.status_code] += 1


async def _publisher(stack: SharedStack) -> None:
    """Alternate: publish a generous hard budget (a new limit each time), delete it."""
    assert stack.control is not None
    url = f"{stack.control.url}/v1alpha1/policies/flow"
    auth = {"Authorization": f"Bearer {WRITER_TOKEN}"}
    async with httpx.AsyncClient(timeout=30) as http:
        for i in range(PUBLISHES):
            if i % 2 == 0:
                doc = budget_policy("flow", "flow", 10**9 + i)  # every request fits
                r = await http.put(url, json=doc, headers=auth)
            else:
                r = await http.delete(url, headers=auth)
            r.raise_for_status()
            await asyncio.sleep(0.02)  # pacing only: let requests flow between publishes


async def _run(stack: SharedStack, key: str) -> Counter[int]:
    statuses: Counter[int] = Counter()
    stop = asyncio.Event()
    clients = [openai.AsyncOpenAI(base_url=f"{g.url}/v1", api_key=key, max_retries=0)
               for g in stack.gateways]
    workers = [asyncio.create_task(_worker(clients[i % len(clients)], stop, statuses))
               for i in range(WORKERS)]
    try:
        await _publisher(stack)
    finally:
        stop.set()
        await asyncio.gather(*workers)
        for c in clients:
            await c.close()
    return statuses


def test_publishing_while_requests_flow_never_answers_503(shared: SharedStack) -> None:
    """Generations published mid-flight: no client sees a 503; each permit is admitted
    under one existing generation, charging the policy account iff it had the policy."""
    key = shared.team_key("flow")
    statuses = asyncio.run(_run(shared, key))
    assert statuses[200] > 0
    assert dict(statuses) == {200: statuses[200]}

    with psycopg.connect(shared.dsn) as conn:
        with_policy = {g for g, docs in conn.execute(
            "SELECT generation, documents FROM policy_generations").fetchall() if "flow" in docs}
        existing = {0} | {g for (g,) in conn.execute(
            "SELECT generation FROM policy_generations").fetchall()}
        permits = conn.execute(
            "SELECT p.generation, count(s.counter) FILTER (WHERE s.kind = 'account')"
            "  FROM permits p LEFT JOIN permit_segments s ON s.permit_id = p.id"
            " GROUP BY p.id, p.generation").fetchall()
    assert len(existing) == PUBLISHES + 1
    assert len(permits) == statuses[200]
    for generation, accounts in permits:
        assert generation in existing
        assert accounts == (1 if generation in with_policy else 0), generation
    # Only meaningful if requests were admitted under several generations and some
    # straddled a publish (and were re-planned).
    assert len({g for g, _ in permits}) > 2
    retried = sum(float(line.rsplit(" ", 1)[1]) for g in shared.gateways
                  for line in httpx.get(f"{g.url}/metrics").text.splitlines()
                  if line.startswith('mayu_snapshot_retries_total{changed="policy"}'))
    assert retried > 0
