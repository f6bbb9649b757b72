"""Synchronous vs asynchronous replication at c=1 (a script, not a test): what waiting for
a standby costs one request's admission and settlement.

Starts the test HA cluster (``tests/_ha.py``: Patroni, etcd, three PostgreSQL members on
this machine), migrates an application database through the multi-host DSN the gateways
use, and runs ``--requests`` sequential admit → settle pairs through the shared store
(``PostgresGovernanceStore``, the gateway's pool settings), first with Patroni's
``synchronous_mode`` on (a commit waits for the synchronous standby's flush), then off;
``--rounds`` alternations. Prints per mode the median over rounds of the mean, p50 and
p99 of a pair's wall time and this process's CPU per pair (the gateway's side: the
database's own CPU is the members').

    .venv/bin/python tests/bench/failover_sync.py [--requests 300] [--rounds 3]

On one machine the standby is on loopback and the test cluster runs with ``fsync`` off:
the figure is the standby's acknowledgement path, not a network's round trip nor a disk
flush (add those for a real deployment). The run is in docs/failover.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.config import DatabaseSettings  # noqa: E402
from gateway.db import open_pool  # noqa: E402
from gateway.governance import Permit, PostgresGovernanceStore  # noqa: E402
from gateway.keys import PostgresKeyStore, TeamLimits  # noqa: E402
from tests._ha import Cluster, create_app_database, start_cluster  # noqa: E402
from tests.conftest import migrate  # noqa: E402
from tests.integration._pg_helpers import principal, request  # noqa: E402
from tests.settling import exact, settlement  # noqa: E402


async def _pairs(store: PostgresGovernanceStore, keys: PostgresKeyStore, n: int,
                 tag: str) -> tuple[list[float], float]:
    """``n`` admit → settle pairs; their wall times (s) and this process's CPU (s)."""
    p = await principal(keys, team=f"bench-{tag}",
                        limits=TeamLimits(usd_micros_per_day=10**12))
    times = []
    cpu = time.process_time()
    for i in range(n):
        started = time.perf_counter()
        [permit] = await store.admit([request(p, usd=1_000, rid=f"{tag}-{i}")])
        assert isinstance(permit, Permit)
        await store.settle(permit.id, settlement(permit.request, exact(10, 400)))
        times.append(time.perf_counter() - started)
    return times, time.process_time() - cpu


def _mode(cluster: Cluster, sync: bool) -> None:
    cluster.patch_config({"synchronous_mode": sync})
    cluster.wait_healthy(sync=sync, deadline_s=120)
    want = "" if not sync else None
    end = time.monotonic() + 60
    while time.monotonic() < end:
        leader = cluster.leader()
        with psycopg.connect(leader.dsn() if leader else cluster.dsn(), autocommit=True) as c:
            row = c.execute("SHOW synchronous_standby_names").fetchone()
        names = "" if row is None else str(row[0])
        if (want == "" and names == "") or (want is None and names):
            return
        time.sleep(0.2)
    raise RuntimeError(f"synchronous_mode={sync} never took effect")


async def main(n: int, rounds: int) -> None:
    cluster = start_cluster(members=3)
    try:
        dsn = create_app_database(cluster)
        migrate(dsn)
        os.environ["INFERPLANE_DATABASE_URL"] = dsn
        pool = open_pool(DatabaseSettings(pool_min_size=2, pool_max_size=6))
        await pool.open(wait=True)
        store = PostgresGovernanceStore(pool, coalesce=1, settle_coalesce=1)
        keys = PostgresKeyStore(pool)
        results: dict[str, list[tuple[float, float, float, float]]] = {"sync": [],
                                                                        "async": []}
        for r in range(rounds):
            for mode in ("sync", "async"):
                await asyncio.to_thread(_mode, cluster, mode == "sync")
                await _pairs(store, keys, 20, f"warm-{mode}-{r}")
                times, cpu = await _pairs(store, keys, n, f"{mode}-{r}")
                q = statistics.quantiles(times, n=100)
                results[mode].append((statistics.mean(times), q[49], q[98], cpu / n))
        await store.close()
        await pool.close()
    finally:
        cluster.stop()
    print(f"c=1 admit+settle pairs, {n} per round, {rounds} rounds (median of rounds)")
    print("mode   mean ms  p50 ms  p99 ms  client CPU ms/pair")
    for mode, rows in results.items():
        cols = [statistics.median(row[i] for row in rows) * 1000 for i in range(4)]
        print(f"{mode:<6} {cols[0]:7.2f} {cols[1]:7.2f} {cols[2]:7.2f} {cols[3]:10.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.rounds))
