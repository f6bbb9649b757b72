"""Policy propagation: accepted publish → first admission under the new generation.

Starts inferplaned and two shared-mode ``mayu serve`` gateways (real processes) on a
fresh migrated database, then, for several rounds, while each gateway is called in a
tight loop by its own client:

- ``restrict``: PUT a hard daily budget of 1 milliUSD for the team (every request's cost
  bound exceeds it, so the first request admitted under the new generation is refused
  with 402);
- ``relax``: DELETE it (the first request under the next generation is a 200 again).

It prints, per gateway and direction, the time from the accepted write (the PUT/DELETE
response received) to the first response that shows the new generation's enforcement,
and the median request round trip (the measurement's granularity). A report, never an
assertion.

    .venv/bin/python tests/bench/publish.py [--rounds 10]

Postgres: ``INFERPLANE_TEST_PG_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/
postgres``); the bench creates and drops its own database.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench._bench import own_database  # noqa: E402
from tests.e2e._controlplane import (  # noqa: E402
    MODEL,
    WRITER_TOKEN,
    SharedStack,
    budget_policy,
)

BODY = {"model": MODEL, "max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}]}


async def hammer(client: httpx.AsyncClient, url: str, key: str, target: int,
                 stop: asyncio.Event, seen: list[tuple[float, int, float]]) -> None:
    """Call ``url`` back to back until ``target`` is answered after ``stop`` is set."""
    headers = {"Authorization": f"Bearer {key}"}
    while True:
        sent = time.perf_counter()
        r = await client.post(f"{url}/v1/chat/completions", json=BODY, headers=headers)
        received = time.perf_counter()
        seen.append((received, r.status_code, received - sent))
        if stop.is_set() and r.status_code == target:
            return


async def one_change(stack: SharedStack, key: str, *, restrict: bool
                     ) -> tuple[list[float], list[float], dict[int, int]]:
    """One publish (or delete); per gateway: latency to the new enforcement, RTTs."""
    target = 402 if restrict else 200
    assert stack.control is not None
    async with httpx.AsyncClient(timeout=30) as client:
        stop = asyncio.Event()
        seen: list[list[tuple[float, int, float]]] = [[] for _ in stack.gateways]
        tasks = [asyncio.create_task(hammer(client, g.url, key, target, stop, s))
                 for g, s in zip(stack.gateways, seen, strict=True)]
        await asyncio.sleep(0.3)  # both loops running, and answering the old generation
        auth = {"Authorization": f"Bearer {WRITER_TOKEN}"}
        url = f"{stack.control.url}/v1alpha1/policies/bench"
        if restrict:
            r = await client.put(url, json=budget_policy("bench", "bench", 1), headers=auth)
        else:
            r = await client.delete(url, headers=auth)
        accepted = time.perf_counter()
        r.raise_for_status()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
    latencies, rtts, statuses = [], [], {}
    for s in seen:
        first = next(t for t, status, _ in s if t >= accepted and status == target)
        latencies.append(first - accepted)
        rtts += [rtt for _, _, rtt in s]
        for _, status, _ in s:
            statuses[status] = statuses.get(status, 0) + 1
    return latencies, rtts, statuses


def ms(values: list[float]) -> str:
    values = sorted(values)
    return (f"min {values[0] * 1000:6.1f} ms  median {statistics.median(values) * 1000:6.1f}"
            f" ms  max {values[-1] * 1000:6.1f} ms")


async def run(stack: SharedStack, key: str, rounds: int) -> None:
    results: dict[tuple[str, int], list[float]] = {}
    rtts: list[float] = []
    statuses: dict[int, int] = {}
    for _ in range(rounds):
        for restrict in (True, False):
            lat, rtt, st = await one_change(stack, key, restrict=restrict)
            rtts += rtt
            for k, v in st.items():
                statuses[k] = statuses.get(k, 0) + v
            for i, value in enumerate(lat):
                results.setdefault(("restrict" if restrict else "relax", i), []).append(value)
    print(f"policy propagation over {rounds} rounds (2 shared-mode gateways, LISTEN/NOTIFY "
          "with a 1 s poll fallback)")
    for (direction, gw), values in sorted(results.items()):
        print(f"  gateway {gw} {direction:8s}: accepted -> first request under the new "
              f"generation: {ms(values)}")
    print(f"  request round trip (granularity): median "
          f"{statistics.median(rtts) * 1000:.1f} ms over {len(rtts)} requests; "
          f"statuses seen {dict(sorted(statuses.items()))}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with own_database("ipd_bench") as dsn, \
            tempfile.TemporaryDirectory(prefix="ipd-bench-") as tmp:
        stack = SharedStack.start(Path(tmp), dsn, gateways=2)
        try:
            key = stack.team_key("bench")
            asyncio.run(run(stack, key, args.rounds))
        finally:
            stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
