"""Concurrent admissions on one hot team, from asyncio tasks and OS processes.

The invariant (DESIGN §9), not an example: a hard µUSD budget is never over-committed,
and once everything settled the window's committed amount equals the sum of the actual
costs, with nothing left reserved. Serialisation is by row lock, so no admission fails
with a serialization error.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter

from gateway.governance import BUCKET_SCALE, PostgresGovernanceStore
from gateway.keys import PostgresKeyStore, TeamLimits, hash_key
from tests.conftest import ROOT
from tests.integration._pg_worker import cycles

BUDGET = 1_000_000
TPM = 50_000


async def _watch(gov: PostgresGovernanceStore, window: str, stop: asyncio.Event,
                 seen: list[int]) -> None:
    """Sample committed + reserved while the load runs."""
    while not stop.is_set():
        row = await gov.counter(window)
        if row is not None:
            seen.append(row["committed"] + row["reserved"])
        await asyncio.sleep(0.01)


async def test_hot_team_budget_and_tpm_hold_across_tasks_and_processes(pg_pool, pg_dsn) -> None:  # type: ignore[no-untyped-def]
    """3 processes x 4 tasks + 4 in-process tasks on one team: committed never exceeds the
    budget; after settling, committed == sum of actual costs and reserved == 0."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    await keys.create_team(name="hot", limits=TeamLimits(usd_micros_per_day=BUDGET, tpm=TPM))
    plaintext, record = await keys.create_key(team="hot")
    principal = await keys.resolve(hash_key(plaintext))
    window = f"team:{record.team_id}:usd:day:2026-11-29"

    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.integration._pg_worker", pg_dsn, hash_key(plaintext),
         "4", "40", str(seed)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for seed in (1, 2, 3)]
    try:
        import random
        local: dict = {"granted": 0, "refused": Counter(), "cost": 0, "tokens": 0}  # type: ignore[type-arg]
        stop, seen = asyncio.Event(), []  # type: ignore[var-annotated]
        watcher = asyncio.create_task(_watch(gov, window, stop, seen))
        await asyncio.gather(*(cycles(gov, principal, 40, random.Random(100 + t), local)
                               for t in range(4)))
        outs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
        stop.set()
        await watcher
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs)
    totals = [local, *outs]
    cost = sum(t["cost"] for t in totals)
    granted = sum(t["granted"] for t in totals)
    refused = Counter()  # type: ignore[var-annotated]
    for t in totals:
        refused.update({int(k): v for k, v in t["refused"].items()})
    row = await gov.counter(window)
    assert row["reserved"] == 0
    assert row["committed"] == cost
    assert row["committed"] <= BUDGET
    assert max(seen, default=0) <= BUDGET
    # The load must actually hit both limits, or the test proves nothing.
    assert refused[402] > 0 and refused[429] > 0 and granted > 0, (refused, granted)
    assert set(refused) <= {402, 429}
    bucket = await gov.counter(f"team:{record.team_id}:tpm")
    assert 0 <= bucket["balance"] <= TPM * BUCKET_SCALE
