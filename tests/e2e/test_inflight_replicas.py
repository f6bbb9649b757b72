"""An in-flight limit of 4 on one key, exact across 3 shared ``mayu serve`` replicas.

Real processes: three gateways on one Postgres database, the mock upstream with latency
(its ``GET /__mock/inflight`` counts the requests open at the upstream and their
high-water mark), the real ``openai`` SDK as the client. The policy (``concurrency:
{maxInFlight: 4}`` on the key) is published in the database as ``inferplaned`` would.

- 50 concurrent streams spread over the replicas, every 4th cut by the client after its
  first chunk: the upstream never sees more than 4 open at once; every refusal is a 429
  ``concurrency_limited`` with the numbers, ``x-should-retry: true`` and
  ``Retry-After: 1``, which the SDK obeys (its own retries serve all 50); afterwards no
  slot is held.
- One replica SIGKILLed while it holds 2 slots: they stay held (its permits are pending;
  the upstream may still be serving them), so the survivors admit 2 more and refuse the
  next; each release lets the 5th in; once the killed replica restarted on its data dir
  (journal replay settles its permits) nothing is held and 4 fit again.

About 25-40 s (measured 30-38 s on the shared 2-core machine): ~10 s to start the mock
and three gateways, ~11 s for 50 streams through 4 slots (the SDK waits the 1 s
Retry-After between its tries, as a real client does), ~2 s for the kill and restart.
No sleep decides an outcome: waits poll the database or the upstream for a condition
(hang guards), and slow streams are held open by not reading them.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest

from gateway.policy import publish
from tests.e2e._procs import Proc, replica_config, run_cli, start_gateway, start_mock_upstream
from tests.e2e.conftest import PRICE

pytestmark = pytest.mark.e2e

LIMIT = 4
STREAMS = 50
REPLICAS = 3


def _config(workdir: Path, upstream: Proc, replica: int) -> Path:
    return replica_config(workdir, replica, upstream, [
        {"name": "gpt-up", "price": PRICE,
         "deployments": [{"provider": "up", "upstream_model": "mock-gpt"}]},
        {"name": "gpt-slow", "price": PRICE,
         "deployments": [{"provider": "up", "upstream_model": "mock-slow-stream"}]}],
        pool_min_size=2, pool_max_size=10, admission_coalesce=2)


@dataclass
class Cluster:
    dsn: str
    upstream: Proc
    gateways: list[Proc]
    configs: list[Path]
    key: str = ""
    key_id: str = ""
    refusals: list[httpx.Response] = field(default_factory=list)

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    @property
    def slot(self) -> str:
        return f"rule:slots/agent-loops:key={self.key_id}:inflight"

    def held(self) -> int:
        """The slots the database holds for the key (its counter's reservations)."""
        rows = self.sql("SELECT reserved FROM counters WHERE key = %s", self.slot)
        return int(rows[0][0]) if rows else 0

    def wait_held(self, predicate: Any, what: str) -> int:
        """Poll until the held count satisfies ``predicate`` (a hang guard)."""
        return _until(lambda: (lambda n: n if predicate(n) else None)(self.held()), what)

    def upstream_inflight(self) -> dict[str, int]:
        reply: dict[str, int] = httpx.get(f"{self.upstream.url}/__mock/inflight").json()
        return reply

    def reset_high_water(self) -> None:
        _until(lambda: self.upstream_inflight()["open"] == 0 or None, "upstream idle")
        httpx.delete(f"{self.upstream.url}/__mock/inflight").raise_for_status()


def _until(probe: Any, what: str, deadline_s: float = 60.0) -> Any:
    import time

    end = time.monotonic() + deadline_s
    while True:
        found = probe()
        if found is not None and found is not False:
            return found
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


async def _publish(dsn: str, key_id: str) -> int:
    doc = {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
           "metadata": {"name": "slots"},
           "spec": {"rules": [{"name": "agent-loops", "failurePolicy": "FailClosed",
                               "subject": {"kind": "key", "key": key_id},
                               "concurrency": {"maxInFlight": LIMIT}}]}}
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        info = await publish(conn, put={"slots": doc}, author="test")
    return info.generation


@pytest.fixture(scope="module")
def cluster(pg_module_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("inflight")
    dsn = pg_module_dsn
    env = {"INFERPLANE_DATABASE_URL": dsn}
    procs: list[Proc] = []
    c: Cluster | None = None
    try:
        upstream = start_mock_upstream(workdir, latency_ms=30)
        procs.append(upstream)
        configs = [_config(workdir, upstream, i) for i in range(REPLICAS)]
        gateways = [start_gateway(c, env=env) for c in configs]
        procs += gateways
        c = Cluster(dsn=dsn, upstream=upstream, gateways=gateways, configs=configs)
        for args in (["teams", "create", "agents", "--json"],
                     ["keys", "create", "--team", "agents", "--json"]):
            done = run_cli(*args, "--config", str(configs[0]), env=env)
            assert done.returncode == 0, done.stderr
        made = json.loads(done.stdout)
        c.key, c.key_id = made["key"], made["record"]["id"]
        generation = asyncio.run(_publish(dsn, c.key_id))
        for gw in gateways:  # every replica enforces the published generation
            _until(lambda gw=gw: httpx.get(
                f"{gw.url}/v1/me", headers={"Authorization": f"Bearer {c.key}"}
            ).json().get("policy_generation") == generation or None, "policy applied")
        yield c
    finally:
        # A test may have replaced a replica (a restart): stop what the cluster holds now.
        running = procs + (c.gateways if c is not None else [])
        for proc in {id(p): p for p in running}.values():
            proc.stop()


def _client(c: Cluster, gw: Proc, *, retries: int) -> openai.AsyncOpenAI:
    async def seen(response: httpx.Response) -> None:
        if response.status_code == 429:
            await response.aread()
            c.refusals.append(response)
    http = httpx.AsyncClient(event_hooks={"response": [seen]}, timeout=60)
    return openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=c.key, max_retries=retries,
                              http_client=http)


async def _one(client: openai.AsyncOpenAI, i: int) -> str:
    """One stream, read to its end or (every 4th) cut after its first chunk."""
    stream = await client.chat.completions.create(
        model="gpt-up", stream=True, max_tokens=64,
        messages=[{"role": "user", "content": f"stream {i}"}])
    async with stream:
        async for _ in stream:
            if i % 4 == 0:
                return "cut"  # leaving the block closes the response: a client cut
    return "done"


def test_fifty_streams_over_three_replicas_never_hold_more_than_four_open(
        cluster: Cluster) -> None:
    """50 concurrent streams (every 4th cut by the client) across 3 replicas: at most 4
    are ever open at the upstream, every refusal is a retryable 429 with its numbers, the
    SDK's own retries serve all 50, and no slot is held afterwards."""
    c = cluster
    c.reset_high_water()
    c.refusals.clear()

    async def run() -> list[str]:
        clients = [_client(c, gw, retries=40) for gw in c.gateways]
        try:
            return await asyncio.gather(*(_one(clients[i % REPLICAS], i)
                                          for i in range(STREAMS)))
        finally:
            for client in clients:
                await client.close()
    ends = asyncio.run(run())
    assert ends.count("cut") == (STREAMS + 3) // 4 and len(ends) == STREAMS
    seen = c.upstream_inflight()
    assert seen["max"] <= LIMIT, seen
    assert seen["max"] == LIMIT  # the limit was reached, so it is what bound
    assert c.refusals, "50 streams through 4 slots were never refused"
    for r in c.refusals:
        assert r.headers["x-should-retry"] == "true" and r.headers["retry-after"] == "1"
        error = r.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "concurrency_limited")
        assert f"{c.slot}: in-flight limit {LIMIT} reached (" in error["message"]
    assert c.wait_held(lambda n: n == 0, "every slot released") == 0
    assert c.sql("SELECT count(*) FROM permits WHERE status = 'pending'") == [(0,)]


class _Held:
    """Slow streams held open by not reading past their first chunk."""

    def __init__(self) -> None:
        self.open: list[tuple[httpx.Client, Any, Any]] = []
        """(client, stream context, chunk iterator): the iterator is kept, since dropping
        it would close the stream."""

    def start(self, c: Cluster, gw: Proc) -> httpx.Response:
        client = httpx.Client(base_url=gw.url, timeout=60)
        cm = client.stream("POST", "/v1/chat/completions", headers={
            "Authorization": f"Bearer {c.key}"}, json={
            "model": "gpt-slow", "stream": True, "max_tokens": 64,
            "messages": [{"role": "user", "content": "hold"}]})
        r = cm.__enter__()
        if r.status_code != 200:
            r.read()
            cm.__exit__(None, None, None)
            client.close()
            return r
        chunks = r.iter_bytes()
        next(chunks)
        self.open.append((client, cm, chunks))
        return r

    def cut(self, n: int = 1) -> None:
        for _ in range(n):
            client, cm, _ = self.open.pop()
            cm.__exit__(None, None, None)
            client.close()


def test_a_killed_replica_keeps_its_slots_until_its_restart_replays_them(
        cluster: Cluster) -> None:
    """SIGKILL a replica holding 2 slots: the survivors admit 2 more and refuse the next
    (429, 4 open); each release admits the 5th; after the restart (journal replay)
    nothing is held and 4 fit again. The upstream never sees more than 4."""
    c = cluster
    c.reset_high_water()
    victim, survivors = c.gateways[2], c.gateways[:2]
    held = _Held()
    try:
        for _ in range(2):
            assert held.start(c, victim).status_code == 200
        dead = held.open[:]
        held.open.clear()
        victim.popen.send_signal(signal.SIGKILL)
        victim.popen.wait()
        for client, _, _ in dead:
            client.close()
        assert c.held() == 2  # pending permits of a dead replica keep their slots
        for gw in survivors:
            assert held.start(c, gw).status_code == 200
        refused = held.start(c, survivors[0])
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "concurrency_limited"
        assert f"in-flight limit {LIMIT} reached ({LIMIT} requests open)" in refused.text
        held.cut()  # a release: the 5th is admitted
        c.wait_held(lambda n: n < LIMIT, "a released slot")
        assert held.start(c, survivors[1]).status_code == 200
        held.cut(len(held.open))
        c.wait_held(lambda n: n == 2, "only the dead replica's slots")
        # Restarted on its own data dir, the replica settles its pending permits from
        # its journal before it serves: their slots come back.
        c.gateways[2] = start_gateway(c.configs[2],
                                      env={"INFERPLANE_DATABASE_URL": c.dsn})
        assert c.held() == 0
        assert c.sql("SELECT count(*) FROM permits WHERE status = 'pending'") == [(0,)]
        for gw in (*c.gateways, c.gateways[0]):
            assert held.start(c, gw).status_code == 200
        assert held.start(c, c.gateways[1]).status_code == 429
        held.cut()
        c.wait_held(lambda n: n < LIMIT, "a released slot")
        assert held.start(c, c.gateways[2]).status_code == 200
    finally:
        held.cut(len(held.open))
    assert c.wait_held(lambda n: n == 0, "every slot released") == 0
    seen = c.upstream_inflight()
    assert seen["max"] <= LIMIT, seen
