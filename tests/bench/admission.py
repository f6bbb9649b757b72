"""Admission benchmark for the shared profile (script, not a test): admissions+settlements
per second and p50/p99, for ONE hot team and for 100 spread teams, each next to a raw
single-row ``UPDATE ...`` (autocommit: ``UPDATE; COMMIT``) loop on the same database, in
the same run, with the same number of concurrent workers. Prints the ratios, and the
serialization failures / deadlocks seen (both should be 0: hot rows are serialised by
their row locks, not by retries).

    .venv/bin/python tests/bench/admission.py --workers 8 --seconds 5

Uses ``INFERPLANE_TEST_PG_DSN`` (default the local server) to create and drop its own
database ``ipbench_<pid>``, migrated with the real alembic migrations.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.governance import (  # noqa: E402
    Permit,
    PostgresGovernanceStore,
    build_request,
)
from gateway.keys import Principal, TeamLimits  # noqa: E402
from gateway.policy import EMPTY_SNAPSHOT  # noqa: E402
from gateway.pricing import Usage  # noqa: E402
from tests.bench._bench import run_on_own_database, team_principal  # noqa: E402
from tests.settling import exact, settlement  # noqa: E402

NOW = datetime.now(UTC)
LIMITS = TeamLimits(tpm=1 << 35, tokens_per_day=1 << 49, usd_micros_per_day=1 << 49)


@dataclass
class Run:
    name: str
    ops: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    elapsed: float = 0.0

    @property
    def rate(self) -> float:
        return self.ops / self.elapsed if self.elapsed else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        return statistics.quantiles(self.latencies, n=100)[int(q) - 1] * 1000

    def line(self) -> str:
        errs = ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items())) or "none"
        return (f"{self.name:<40} {self.rate:9.0f}/s  p50 {self.pct(50):6.2f} ms  "
                f"p99 {self.pct(99):6.2f} ms  errors: {errs}")


async def _drive(name: str, workers: int, seconds: float,
                 op: Callable[[int], Awaitable[int]]) -> Run:
    run = Run(name)
    stop = time.monotonic() + seconds

    async def worker(w: int) -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            try:
                n = await op(w)
            except psycopg.errors.SerializationFailure:
                run.errors["serialization_failure"] = run.errors.get("serialization_failure", 0) + 1
                continue
            except psycopg.errors.DeadlockDetected:
                run.errors["deadlock"] = run.errors.get("deadlock", 0) + 1
                continue
            run.latencies.append(time.perf_counter() - t0)
            run.ops += n

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(workers)))
    run.elapsed = time.perf_counter() - t0
    return run


async def _principals(pool: AsyncConnectionPool, teams: int) -> list[Principal]:
    return [await team_principal(pool, f"team{t}", LIMITS) for t in range(teams)]


def _admit_settle(gov: PostgresGovernanceStore, pick: Callable[[int], Principal],
                  batch: int, run_errors: dict[str, int]) -> Callable[[int], Awaitable[int]]:
    """One worker step: admit ``batch`` requests in one call, settle each granted one."""
    async def op(w: int) -> int:
        principal = pick(w)
        reqs = [build_request(principal, EMPTY_SNAPSHOT, request_id=f"b{w}", model="m",
                              token_bound=500, usd_bound=2_000, now=NOW)
                for _ in range(batch)]
        decisions = await gov.admit(reqs)
        done = 0
        for req, d in zip(reqs, decisions, strict=True):
            if not isinstance(d, Permit):
                run_errors[f"refused_{d.status}"] = run_errors.get(f"refused_{d.status}", 0) + 1
                continue
            out = exact(Usage(input=300, output=100).total_tokens(), 1_234)
            await gov.settle(d.id, settlement(req, out))
            done += 1
        return done
    return op


def _raw_update(pool: AsyncConnectionPool, row: Callable[[int], int]
                ) -> Callable[[int], Awaitable[int]]:
    async def op(w: int) -> int:
        async with pool.connection() as conn:
            await conn.execute("UPDATE bench_raw SET v = v + 1 WHERE id = %s", (row(w),))
        return 1
    return op


async def bench(dsn: str, workers: int, seconds: float) -> list[tuple[Run, Run]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_raw (id int PRIMARY KEY, v bigint NOT NULL)")
        conn.execute("INSERT INTO bench_raw SELECT g, 0 FROM generate_series(0, 99) g")
    async with AsyncConnectionPool(dsn, min_size=workers, max_size=workers,
                                   kwargs={"autocommit": True}) as pool:
        principals = await _principals(pool, 100)
        plain = PostgresGovernanceStore(pool)
        # Coalescing: at most 2 admission calls in flight; the other workers' requests
        # queue meanwhile and go as one batch.
        coalesced = PostgresGovernanceStore(pool, coalesce=2)
        pairs = []
        for label, gov, pick, row, batch in (
                ("hot team", plain, lambda w: principals[0], lambda w: 0, 1),
                ("100 spread teams", plain, lambda w: principals[w % 100],
                 lambda w: w % 100, 1),
                ("hot team, 8 admissions per call", plain, lambda w: principals[0],
                 lambda w: 0, 8),
                ("hot team, store coalesce=2", coalesced, lambda w: principals[0],
                 lambda w: 0, 1)):
            adm = Run("")  # placeholder so errors dict is shared with the driver's run
            admit_run = await _drive(f"admit+settle, {label}", workers, seconds,
                                     _admit_settle(gov, pick, batch, adm.errors))
            admit_run.errors.update(adm.errors)
            raw_run = await _drive(f"raw UPDATE;COMMIT, {label}", workers, seconds,
                                   _raw_update(pool, row))
            pairs.append((admit_run, raw_run))
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    pairs = run_on_own_database("ipbench", lambda dsn: bench(dsn, args.workers, args.seconds))
    print(f"{args.workers} concurrent workers, {args.seconds:.0f} s per measurement; "
          "admit+settle = 2 round trips (one admission, one settlement) per admission")
    for admit_run, raw_run in pairs:
        print(admit_run.line())
        print(raw_run.line())
        print(f"{'':<40} ratio admissions/raw updates: {admit_run.rate / raw_run.rate:.2f}")


if __name__ == "__main__":
    main()
