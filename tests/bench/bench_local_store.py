"""Benchmark: the local-profile governance store alone (a script, not a test).

Admit + settle pairs on one SQLite file shared with the key store (as ``mayu serve``
keeps them, so admission re-checks the key and team rows), with five counters per
request (team RPM, TPM, tokens/day, µUSD/day; key µUSD/day), the loop turning after
each admission and each settlement (as it does in the gateway for the upstream call
and for the response). For one request at a time and for 32 concurrent asyncio tasks,
on one hot team and on 64 spread teams, it prints pairs per second, the process CPU per
pair (µs) and, where the store says, operations per transaction.

    .venv/bin/python tests/bench/bench_local_store.py [N] [--max-batch K]

``--max-batch 1`` runs every operation in a transaction of its own (no batching). To
measure another checkout with the same script: ``PYTHONPATH=/tmp/base python
tests/bench/bench_local_store.py`` (``--max-batch`` is ignored by a store without it).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import inspect
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.governance import LocalGovernanceStore, Permit, build_request  # noqa: E402
from gateway.keys import KeyLimits, Principal, SqliteKeyStore, TeamLimits  # noqa: E402
from gateway.policy import EMPTY_SNAPSHOT  # noqa: E402
from gateway.pricing import Usage  # noqa: E402
from tests.settling import exact, settlement  # noqa: E402

LIMITS = TeamLimits(rpm=10**9, tpm=10**9, tokens_per_day=10**12, usd_micros_per_day=10**12)


async def one(store: LocalGovernanceStore, p: Principal) -> None:
    req = build_request(p, EMPTY_SNAPSHOT, request_id=uuid.uuid4().hex, model="m",
                        token_bound=1000, usd_bound=5000, now=datetime.now(UTC))
    [permit] = await store.admit([req])
    assert isinstance(permit, Permit), permit
    await asyncio.sleep(0)  # the upstream call: the loop turns between admit and settle
    outcome = exact(Usage(input=400, output=100).total_tokens(), 1234)
    await store.settle(permit.id, settlement(req, outcome))
    await asyncio.sleep(0)  # the response and the next request: the loop turns again


async def principals(keys: SqliteKeyStore, teams: int) -> list[Principal]:
    found = []
    for i in range(teams):
        await keys.create_team(name=f"t{i}", limits=LIMITS)
        plaintext, _ = await keys.create_key(
            team=f"t{i}", limits=KeyLimits(usd_micros_per_day=10**12))
        p = await keys.resolve(hashlib.sha256(plaintext.encode()).hexdigest())
        assert p is not None
        found.append(p)
    return found


async def run(n: int, *, teams: int, concurrency: int,
              max_batch: int | None) -> tuple[float, float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "bench.db")
        keys = SqliteKeyStore(path)
        await keys.open()
        kw = {}
        if max_batch is not None and "max_batch" in inspect.signature(
                LocalGovernanceStore).parameters:
            kw["max_batch"] = max_batch
        store = LocalGovernanceStore(path, **kw)
        await store.open()
        ps = await principals(keys, teams)
        for i in range(50):  # warm up: every counter row exists
            await one(store, ps[i % teams])
        sem = asyncio.Semaphore(concurrency)

        async def bounded(i: int) -> None:
            async with sem:
                await one(store, ps[i % teams])

        batcher = getattr(store, "_batcher", None)
        ops0, tx0 = (batcher.operations, batcher.transactions) if batcher else (0, 0)
        cpu, start = time.process_time(), time.perf_counter()
        if concurrency == 1:
            for i in range(n):
                await one(store, ps[i % teams])
        else:
            await asyncio.gather(*(bounded(i) for i in range(n)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        batches = ""
        if batcher is not None:
            ops, tx = batcher.operations - ops0, batcher.transactions - tx0
            batches = f"{ops / tx:5.1f} ops/tx"
        await store.close()
        await keys.close()
    return n / elapsed, cpu / n * 1e6, batches


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=2000)
    parser.add_argument("--max-batch", type=int, default=None)
    args = parser.parse_args()
    print(f"local store, {args.n} admit+settle pairs, keys in the same file"
          f" (max_batch={args.max_batch or 'default'})")
    for label, teams, concurrency in (("one at a time", 1, 1), ("hot team, 32 tasks", 1, 32),
                                      ("64 teams, 32 tasks", 64, 32)):
        rate, cpu, batches = await run(args.n, teams=teams, concurrency=concurrency,
                                       max_batch=args.max_batch)
        print(f"  {label:20s} {rate:8.0f} pairs/s  {cpu:6.0f} µs CPU/pair  {batches}")


if __name__ == "__main__":
    asyncio.run(main())
