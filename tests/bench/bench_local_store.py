"""Benchmark: local-profile governance store throughput (a script, not a test).

Reports admissions+settlements per second for one hot team (every request on the same
counters) and for spread teams, concurrently from asyncio tasks, and their ratio.
Run: ``.venv/bin/python tests/bench/bench_local_store.py [N]``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from gateway.governance import (
    LocalGovernanceStore,
    Permit,
    build_request,
)
from gateway.keys import KeyLimits, Principal, Team, TeamLimits
from gateway.policy import EMPTY_SNAPSHOT
from gateway.pricing import Usage
from tests.settling import exact, settlement

LIMITS = TeamLimits(rpm=10**9, tpm=10**9, tokens_per_day=10**12, usd_micros_per_day=10**12)


def principal(team: int) -> Principal:
    return Principal(key_id=f"key_{team}", key_prefix="sk-inf-bench", key_revision=1,
                     key_limits=KeyLimits(usd_micros_per_day=10**12),
                     allowed_models=None,
                     team=Team(id=f"team_{team}", name=f"t{team}", limits=LIMITS))


async def one(store: LocalGovernanceStore, p: Principal) -> None:
    req = build_request(p, EMPTY_SNAPSHOT, request_id=uuid.uuid4().hex, model="m",
                        token_bound=1000, usd_bound=5000, now=datetime.now(UTC))
    [permit] = await store.admit([req])
    assert isinstance(permit, Permit)
    outcome = exact(Usage(input=400, output=100).total_tokens(), 1234)
    await store.settle(permit.id, settlement(req, outcome))


async def run(n: int, teams: int, concurrency: int = 32) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalGovernanceStore(str(Path(tmp) / "bench.db"))
        await store.open()
        sem = asyncio.Semaphore(concurrency)
        principals = [principal(i) for i in range(teams)]

        async def bounded(i: int) -> None:
            async with sem:
                await one(store, principals[i % teams])

        start = time.perf_counter()
        await asyncio.gather(*(bounded(i) for i in range(n)))
        elapsed = time.perf_counter() - start
        await store.close()
    return n / elapsed


async def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    hot = await run(n, teams=1)
    spread = await run(n, teams=64)
    print(f"local store, {n} admit+settle pairs, 32 concurrent tasks")
    print(f"  hot team (1):     {hot:8.0f} requests/s")
    print(f"  spread teams (64): {spread:8.0f} requests/s")
    print(f"  hot / spread:     {hot / spread:8.2f}")


if __name__ == "__main__":
    asyncio.run(main())
