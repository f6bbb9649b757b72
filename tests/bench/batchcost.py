"""What one batch costs the database (a script, not a test): the shared profile's
admission and settlement calls timed alone, on one connection, v2 against v3 against the
v4 calls (v3 planned without sequential scans) against the v5 calls (v4 planned once per
session, a lone settlement set-based) against the v6 ones (5's lone calls, batches parsed
and sorted once: the gateway's), for batches of several sizes, in one run.

For each SQL version (each on its own connection) and batch size N, ``--iterations``
times: one admission call for N requests of one team (``_admit_now``:
``inferplane_admit_v2``, ``_v3``, ``_v4``, ``_v5`` or ``_v6``; a lone request the lone call), then
one settlement call for the N permits (``_settle_many``: v2's per-permit calls in one
pipelined transaction, or one ``inferplane_settle_v3``, ``_v4``, ``_v5`` or ``_v6``; a lone permit
``_settle_one``, as a gateway settles one alone); the tables grow as it runs (a permit and its
segments per request, as in a gateway), so later figures show how a version's cached
plans scale with them. The median wall time of each
call is printed, per call and per operation, next to ``SELECT 1``'s round trip. With no
other client this is the in-lock cost a hot team pays per batch (docs/hot-team.md).

    .venv/bin/python tests/bench/batchcost.py [--sizes 1 8 32] [--iterations 60]

Uses ``INFERPLANE_TEST_PG_DSN`` to create, migrate and drop its own database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.governance import Permit, PostgresGovernanceStore  # noqa: E402
from gateway.keys import TeamLimits  # noqa: E402
from tests.bench._bench import (  # noqa: E402
    batch_requests,
    exact_settlements,
    own_database,
    team_principal,
)

LIMITS = TeamLimits(tpm=1 << 35, tokens_per_day=1 << 49, usd_micros_per_day=1 << 49)


async def run(dsn: str, sizes: list[int], iterations: int, rounds: int) -> None:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1,
                                   kwargs={"autocommit": True}) as pool:
        principal = await team_principal(pool, "t", LIMITS)
        now = datetime.now(UTC)
        times: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
        # One connection per version: v4 and v5 run v3's functions, whose plans a
        # session caches whichever call planned them first.
        pools = {fn: AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False,
                                         kwargs={"autocommit": True}) for fn in (2, 3, 4, 5, 6)}
        for own in pools.values():
            await own.open(wait=True)
        for _ in range(rounds):  # versions alternate, so all see the same machine
            for fn, own in pools.items():
                store = PostgresGovernanceStore(own, functions=fn)
                for n in sizes:
                    admit_s, settle_s = times.setdefault((fn, n), ([], []))
                    for i in range(iterations):
                        reqs = batch_requests(principal, now, n)
                        t0 = time.perf_counter()
                        decisions = await store._admit_now(reqs)
                        t1 = time.perf_counter()
                        permits = [d for d in decisions if isinstance(d, Permit)]
                        assert len(permits) == n, decisions
                        items = exact_settlements(permits)
                        await (store._settle_one(*items[0]) if n == 1
                               else store._settle_many(items))
                        t2 = time.perf_counter()
                        if i >= iterations // 6:  # warm plans and caches first
                            admit_s.append(t1 - t0)
                            settle_s.append(t2 - t1)
        for own in pools.values():
            await own.close()
        async with pool.connection() as conn:
            rtt = []
            for _ in range(200):
                t0 = time.perf_counter()
                await conn.execute("SELECT 1")
                rtt.append(time.perf_counter() - t0)
    print(f"{'SQL':<4} {'batch':>5} {'admit ms':>9} {'per request':>12} {'settle ms':>10} "
          f"{'per settlement':>15}")
    for (fn, n), (admit_s, settle_s) in sorted(times.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        a, s = statistics.median(admit_s) * 1e3, statistics.median(settle_s) * 1e3
        print(f"v{fn:<3} {n:>5} {a:9.2f} {a / n:12.3f} {s:10.2f} {s / n:15.3f}")
    print(f"SELECT 1 round trip: {statistics.median(rtt) * 1e3:.3f} ms; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    with own_database("ipcost") as dsn:
        asyncio.run(run(dsn, a.sizes, a.iterations, a.rounds))


if __name__ == "__main__":
    main()
