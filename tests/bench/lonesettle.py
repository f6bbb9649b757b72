"""Lone-settlement bench (a script, not a test): what a client's next request waits for
at concurrency 1 in the shared profile, with each ``functions`` version's lone
settlement, in one run.

A gateway answers before it settles (``server.settle_wait_s`` 0), so a client sending
its next request as soon as it has the answer is admitted while its previous request's
settlement is in the database; on the same team the admission waits for the counter rows
that settlement locked. One ``PostgresGovernanceStore`` per version (the gateway's
coalescing: one admission and one settlement call in flight), on one team with the
gateway's limits (RPM and TPM buckets, day token and µUSD windows), loops: admit one
request, hold the permit ``--upstream-ms`` (the upstream call), start its settlement
without awaiting it, then admit the next request (awaiting the previous settlement only
after that, so at most one is in flight). Versions alternate for ``--rounds``; printed
per version: the admission's mean and p50 wall time, the settlement's, and the CPU of
the store's Postgres backends per admit + settle pair (``/proc``), medians of the
rounds.

    .venv/bin/python tests/bench/lonesettle.py [--versions 6 7] [--rounds 5] [--pairs 1500]

Uses ``INFERPLANE_TEST_PG_DSN`` to create, migrate and drop its own database.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.governance import Permit, PostgresGovernanceStore, build_request  # noqa: E402
from gateway.keys import TeamLimits  # noqa: E402
from gateway.policy import EMPTY_SNAPSHOT  # noqa: E402
from tests.bench._bench import cpu_s, machine_ms, own_database, team_principal  # noqa: E402
from tests.settling import exact, settlement  # noqa: E402

LIMITS = TeamLimits(rpm=1 << 30, tpm=1 << 35, tokens_per_day=1 << 49,
                    usd_micros_per_day=1 << 49)


async def _backends(pool: AsyncConnectionPool[Any]) -> list[int]:
    async with pool.connection() as conn:
        rows = await (await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")).fetchall()
    return [r[0] for r in rows]


async def _round(dsn: str, principal: Any, functions: int, pairs: int,
                 upstream_s: float) -> tuple[list[float], list[float], float]:
    """(admission seconds, settlement seconds, Postgres CPU seconds) of ``pairs``."""
    async with AsyncConnectionPool(dsn, min_size=3, max_size=3,
                                   kwargs={"autocommit": True}) as pool:
        store = PostgresGovernanceStore(pool, coalesce=1, settle_coalesce=1,
                                        functions=functions)
        now = datetime.now(UTC)
        admits: list[float] = []
        settles: list[float] = []

        async def settle(permit: Permit) -> None:
            t0 = time.perf_counter()
            await store.settle(permit.id, settlement(permit.request, exact(400, 1_234)))
            settles.append(time.perf_counter() - t0)

        async def loop(n: int) -> None:
            before: asyncio.Task[None] | None = None
            for i in range(n):
                req = build_request(principal, EMPTY_SNAPSHOT, request_id=f"r{i}",
                                    model="m", token_bound=500, usd_bound=2_000, now=now)
                t0 = time.perf_counter()
                [permit] = await store.admit([req])
                admits.append(time.perf_counter() - t0)
                assert isinstance(permit, Permit), permit
                if upstream_s:
                    await asyncio.sleep(upstream_s)
                task = asyncio.ensure_future(settle(permit))
                if before is not None:
                    await before
                before = task
            if before is not None:
                await before

        await loop(50)  # warm: plans cached, connections held
        admits.clear()
        settles.clear()
        backends = await _backends(pool)
        pg0 = sum(cpu_s(b) for b in backends)
        await loop(pairs)
        pg = sum(cpu_s(b) for b in backends) - pg0
        await store.close()
    return admits, settles, pg


async def run(dsn: str, versions: list[int], rounds: int, pairs: int,
              upstream_s: float) -> None:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1,
                                   kwargs={"autocommit": True}) as setup:
        principal = await team_principal(setup, "t", LIMITS)
    got: dict[int, list[tuple[float, float, float, float, float]]] = {v: [] for v in versions}
    for rnd in range(rounds):
        for v in versions:
            admits, settles, pg = await _round(dsn, principal, v, pairs, upstream_s)
            got[v].append((statistics.fmean(admits), statistics.median(admits),
                           statistics.fmean(settles), statistics.median(settles),
                           pg / pairs))
        print(f"round {rnd + 1}/{rounds}: " + ", ".join(
            f"v{v} admission {got[v][-1][0] * 1e3:.3f} ms" for v in versions), flush=True)
    print(f"\n{pairs} pairs per round, permits held {upstream_s * 1e3:g} ms, medians of "
          f"{rounds} rounds")
    print(f"{'functions':>9} {'admission mean':>15} {'p50':>8} {'settlement mean':>16} "
          f"{'p50':>8} {'Postgres CPU per pair':>22}")
    for v in versions:
        cols = [statistics.median(r[i] for r in got[v]) * 1e3 for i in range(5)]
        print(f"{v:>9} {cols[0]:12.3f} ms {cols[1]:5.3f} ms {cols[2]:13.3f} ms "
              f"{cols[3]:5.3f} ms {cols[4]:19.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, nargs="+", default=[6, 7])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=1500)
    ap.add_argument("--upstream-ms", type=float, default=0.3)
    a = ap.parse_args()
    speed0 = machine_ms()
    with own_database("iplone") as dsn:
        asyncio.run(run(dsn, a.versions, a.rounds, a.pairs, a.upstream_ms / 1e3))
    print(f"machine: {speed0:.0f} -> {machine_ms():.0f} ms per probe loop "
          f"(tests/bench/_bench.py machine_ms)")


if __name__ == "__main__":
    main()
