"""What operating features cost: audit fsync policies, alert checks, cluster gauge reads.

    .venv/bin/python tests/bench/operate.py [--lines 20000]

- audit: time per ``AuditLog.write`` (a ~600-byte settled line) with ``interval`` and
  ``always`` fsync, and of a write that rotates the file, on the data dir's disk;
- alerts: one ``budget_alerts`` round trip (3 budgets below their thresholds, and at
  100 % where every insert conflicts), and how many round trips a burst of settlements
  costs through :class:`BudgetAlerts` (they batch);
- gauges: one scrape's ``cluster_budgets`` + ``cluster_status`` read with 1,000 teams
  (day and month budgets) and 60 days of old windows in the table.

Postgres from ``INFERPLANE_TEST_PG_DSN`` (a scratch database is created and dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.alerts import Budget, BudgetAlerts, PostgresAlertStore  # noqa: E402
from gateway.audit import AuditLog  # noqa: E402
from gateway.cluster_metrics import postgres_reader  # noqa: E402
from gateway.governance import Charge, OutcomeKind, Permit, Settlement  # noqa: E402
from gateway.metrics import Metrics  # noqa: E402
from tests.bench._bench import run_on_own_database  # noqa: E402

LINE: dict[str, Any] = {
    "event": "settled", "request_id": "req_" + "0" * 32, "attempt": 0,
    "permit": "0b7e5f0e-3c1c-4d51-9a36-8c1f3b1f1f1f", "key_id": "key_" + "a" * 16,
    "team_id": "team_" + "b" * 16, "user": None, "model": "claude-sonnet-4",
    "provider": "anthropic", "upstream_model": "claude-sonnet-4-20250514",
    "endpoint": "messages", "stream": True, "token_bound": 41_000, "usd_bound": 612_000,
    "status": 200, "outcome": "complete", "detail": "",
    "usage": {"input": 1200, "output": 350, "cache_read": 30_000, "cache_write_5m": 0,
              "cache_write_1h": 0, "cache_write_unknown": 0},
    "tokens_committed": 31_550, "usd_committed": 17_850, "tokens_liability": 0,
    "usd_liability": 0, "bound_exceeded": False, "stored": True}


def _ms(xs: list[float]) -> str:
    xs = sorted(xs)
    return (f"median {statistics.median(xs) * 1e3:.3f} ms, p99 "
            f"{xs[int(len(xs) * 0.99) - 1] * 1e3:.3f} ms")


def _us(xs: list[float]) -> str:
    xs = sorted(xs)
    return (f"median {statistics.median(xs) * 1e6:.1f} µs, p99 "
            f"{xs[int(len(xs) * 0.99) - 1] * 1e6:.1f} µs")


async def bench_audit(lines: int, where: Path) -> None:
    for policy, n in (("interval", lines), ("always", max(200, lines // 10))):
        path = where / f"audit-{policy}.jsonl"
        audit = AuditLog(str(path), fsync=policy, fsync_interval_s=1.0)  # type: ignore[arg-type]
        audit.open()
        audit.start()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            audit.write(LINE)
            times.append(time.perf_counter() - t)
            if policy == "interval" and len(times) % 500 == 0:
                await asyncio.sleep(0)  # let the interval fsync task run
        await audit.aclose()
        print(f"audit {policy:8s}: {n} writes, {_us(times)}")
    path = where / "audit-rotate.jsonl"
    audit = AuditLog(str(path), max_bytes=64 * 1024, keep=5)
    audit.open()
    rotating = []
    for _ in range(2_000):
        before = audit.rotations
        t = time.perf_counter()
        audit.write(LINE)
        if audit.rotations != before:
            rotating.append(time.perf_counter() - t)
    audit.close()
    print(f"audit rotation: {len(rotating)} rotating writes, {_us(rotating)}")


async def _seed(pool: Any, teams: int, days: int) -> list[Budget]:
    """``teams`` team day+month windows for today (at 50 %) and ``days`` old windows."""
    now = datetime.now(UTC)
    day, month = now.strftime("%Y-%m-%d"), now.strftime("%Y-%m")
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO counters (key, kind, dimension, \"limit\", \"window\", committed)"
            " SELECT 'team:team_' || t || ':usd:' || w.kind || ':' || w.period, 'window',"
            " 'usd', 1000000, w.period, 500000 FROM generate_series(1, %(teams)s) t,"
            " (VALUES ('day', %(day)s), ('month', %(month)s)) w(kind, period)",
            {"teams": teams, "day": day, "month": month})
        for back in range(1, days + 1):
            old = (now - timedelta(days=back)).strftime("%Y-%m-%d")
            await conn.execute(
                "INSERT INTO counters (key, kind, dimension, \"limit\", \"window\","
                " committed) SELECT 'team:team_' || t || ':usd:day:' || %(d)s, 'window',"
                " 'usd', 1000000, %(d)s, 900000 FROM generate_series(1, %(teams)s) t",
                {"teams": teams, "d": old})
        await conn.execute("ANALYZE counters")
    return [Budget(counter=f"team:team_{t}:usd:day:{day}", kind="window", window=day,
                   limit=1_000_000) for t in range(1, 4)]


async def _timed(n: int, call: Callable[[], Awaitable[object]]) -> list[float]:
    """Seconds each of ``n`` awaits of ``call()`` took, one after another."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        await call()
        times.append(time.perf_counter() - t)
    return times


async def bench_db(dsn: str) -> None:
    from gateway.config import DatabaseSettings
    from gateway.db import open_pool

    os.environ["INFERPLANE_DATABASE_URL"] = dsn
    pool = open_pool(DatabaseSettings(pool_min_size=1, pool_max_size=4))
    await pool.open(wait=True)
    try:
        budgets = await _seed(pool, 1_000, 60)
        store = PostgresAlertStore(pool)
        below = await _timed(300, lambda: store.check(budgets, replica="bench"))
        print(f"alert check, 3 budgets at 50 %: {_ms(below)}")
        async with pool.connection() as conn:
            await conn.execute("UPDATE counters SET committed = \"limit\" WHERE key = ANY(%s)",
                               [[b.counter for b in budgets]])
        await store.check(budgets, replica="bench")  # claims the 9 events
        full = await _timed(300, lambda: store.check(budgets, replica="bench"))
        print(f"alert check, 3 budgets at 100 % (every insert conflicts): {_ms(full)}")
        await _burst(pool)
        read = postgres_reader(pool)
        now = datetime.now(UTC)
        scrapes = []
        for _ in range(50):
            t = time.perf_counter()
            figures = await read(now.strftime("%Y-%m-%d"), now.strftime("%Y-%m"))
            scrapes.append(time.perf_counter() - t)
        print(f"cluster gauges read ({len(figures.budgets)} budgets; 62,000 window rows "
              f"in the table): {_ms(scrapes)}")
    finally:
        await pool.close()


async def _burst(pool: Any) -> None:
    """200 settlements on 20 budgets arriving in bursts of 20 every 5 ms."""
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    metrics = Metrics()
    with tempfile.TemporaryDirectory() as tmp:
        audit = AuditLog(str(Path(tmp) / "a.jsonl"))
        audit.open()
        alerts = BudgetAlerts(PostgresAlertStore(pool), replica="bench", metrics=metrics,
                              audit=audit)
        await alerts.start()
        from gateway.governance import AdmissionRequest

        for i in range(200):
            counter = f"team:team_{100 + i % 20}:usd:day:{day}"
            charge = Charge(counter=counter, kind="window", dimension="usd", amount=10,
                            limit=1_000_000, window=day)
            permit = Permit(id=str(i), request=AdmissionRequest(
                request_id="r", key_id="k", key_revision=1, team_id="t", team_revision=1,
                user=None, model="m", token_bound=1, usd_bound=10, policy_generation=0,
                charges=(charge,), day=day, month=day[:7]))
            alerts.settled(permit, Settlement(kind=OutcomeKind.COMPLETE, usd_committed=10,
                                              commits={counter: 10}))
            if i % 20 == 19:
                await asyncio.sleep(0.005)
        await alerts.close()
        audit.close()
    print(f"alert checks for 200 settlements in bursts of 20: {alerts.checks} round trips")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    args = parser.parse_args()
    where = Path(tempfile.mkdtemp(prefix="bench-audit-", dir=str(Path.home())))
    try:
        asyncio.run(bench_audit(args.lines, where))
    finally:
        for p in where.iterdir():
            p.unlink()
        where.rmdir()
    run_on_own_database("ipt_bench_operate", bench_db)


if __name__ == "__main__":
    main()
