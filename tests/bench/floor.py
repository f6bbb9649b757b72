"""What the row work alone costs Postgres (a script, not a test): the CPU of one backend
per admit + settle pair through the gateway's calls, next to
two floors doing only the same row work with the fewest statements, in one run.

For batch sizes N (``--sizes``), each on its own connection, ``--pairs`` operations:

- **the gateway's calls**: ``PostgresGovernanceStore`` (as a gateway opens it,
  printed as ``gateway calls``) admitting N requests of one team charging four counters (RPM and
  TPM buckets, day token and µUSD windows) in one call, then settling them exactly in
  one call (a lone request: the lone calls);
- **floor, segments as rows**: a PL/pgSQL function that takes the same locks (key, team,
  policy state ``FOR SHARE``; four counters ``FOR UPDATE`` in key order), updates the
  counters and inserts N permits and 4·N ``permit_segments`` rows, then one that locks
  the permits, reads and updates their segments, updates the permits and the counters:
  no JSON, no snapshot check, no decision — the writes a pair cannot avoid today;
- **floor, segments folded**: the same with the segments kept as a jsonb column of the
  permit row (added to this throwaway database only), to size what folding them into
  the permit (a schema change) would save.

CPU is the backend's user + system time (``/proc/<pid>/stat``) over the timed pairs
(after a warm-up), divided by the operations; wall per pair is printed too. The gap
between the gateway's calls and the row floor is what the functions' own statements cost (parsing,
arrays, decisions, answers); the gap between the two floors is the segment rows'.

    .venv/bin/python tests/bench/floor.py [--sizes 1 4 16] [--pairs 1600]

Uses ``INFERPLANE_TEST_PG_DSN`` to create, migrate and drop its own database.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.governance import Permit, PostgresGovernanceStore  # noqa: E402
from gateway.keys import TeamLimits  # noqa: E402
from tests.bench._bench import (  # noqa: E402
    batch_requests,
    cpu_s,
    exact_settlements,
    run_on_own_database,
    team_principal,
)

LIMITS = TeamLimits(rpm=1 << 30, tpm=1 << 35, tokens_per_day=1 << 49,
                    usd_micros_per_day=1 << 49)

FLOOR = """
ALTER TABLE permits ADD COLUMN floor_segments jsonb;
INSERT INTO teams (id, name) VALUES ('floor', 'floor');
INSERT INTO keys (id, team_id, key_hash, display_prefix) VALUES ('floor', 'floor', 'floor', 'x');
INSERT INTO counters (key, kind, dimension, "window")
     SELECT 'team:floor:c' || g, 'window', 'tokens', 'd' FROM generate_series(1, 4) g;
CREATE FUNCTION floor_admit(n int, folded boolean) RETURNS uuid[]
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    ids uuid[] := array(SELECT gen_random_uuid() FROM generate_series(1, n));
    ks text[] := array(SELECT 'team:floor:c' || g FROM generate_series(1, 4) g);
BEGIN
    PERFORM 1 FROM keys WHERE id = 'floor' FOR SHARE;
    PERFORM 1 FROM teams WHERE id = 'floor' FOR SHARE;
    PERFORM 1 FROM policy_state FOR SHARE;
    PERFORM 1 FROM counters WHERE key = ANY(ks) ORDER BY key COLLATE "C" FOR UPDATE;
    UPDATE counters SET reserved = reserved + n WHERE key = ANY(ks);
    INSERT INTO permits (id, request_id, key_id, team_id, model, token_bound, usd_bound,
                         generation, day, month, admitted_us, floor_segments)
    SELECT i, 'r', 'floor', 'floor', 'm', 500, 2000, 0, '2026-12-01', '2026-12', 0,
           CASE WHEN folded THEN (SELECT jsonb_agg(jsonb_build_object(
               'counter', k, 'kind', 'window', 'dimension', 'tokens', 'amount', 1))
               FROM unnest(ks) k) END
      FROM unnest(ids) i;
    IF NOT folded THEN
        INSERT INTO permit_segments (permit_id, counter, kind, dimension, amount)
        SELECT i, k, 'window', 'tokens', 1 FROM unnest(ids) i, unnest(ks) k;
    END IF;
    RETURN ids;
END $$;
CREATE FUNCTION floor_settle(ids uuid[], folded boolean) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    ks text[] := array(SELECT 'team:floor:c' || g FROM generate_series(1, 4) g);
BEGIN
    PERFORM 1 FROM permits WHERE id = ANY(ids) ORDER BY id FOR UPDATE;
    IF folded THEN
        UPDATE permits SET status = 'complete', tokens_committed = 1, usd_committed = 1,
               settled_at = clock_timestamp(),
               floor_segments = (SELECT jsonb_agg(e || '{"committed": 1}')
                                   FROM jsonb_array_elements(floor_segments) e)
         WHERE id = ANY(ids);
    ELSE
        PERFORM 1 FROM permit_segments WHERE permit_id = ANY(ids);
        UPDATE permit_segments SET committed = 1 WHERE permit_id = ANY(ids);
        UPDATE permits SET status = 'complete', tokens_committed = 1, usd_committed = 1,
               settled_at = clock_timestamp()
         WHERE id = ANY(ids);
    END IF;
    PERFORM 1 FROM counters WHERE key = ANY(ks) ORDER BY key COLLATE "C" FOR UPDATE;
    UPDATE counters SET reserved = reserved - cardinality(ids),
                        committed = committed + cardinality(ids)
     WHERE key = ANY(ks);
END $$;
"""

async def _timed(pool: AsyncConnectionPool[Any], pair: Callable[[], Awaitable[None]],
                 rounds: int) -> tuple[float, float]:
    """(backend CPU s, wall s) of ``rounds`` calls of ``pair`` after a warm-up."""
    async with pool.connection() as conn:
        [(pid,)] = await (await conn.execute("SELECT pg_backend_pid()")).fetchall()
    for _ in range(max(10, rounds // 10)):
        await pair()
    c0, t0 = cpu_s(pid), time.perf_counter()
    for _ in range(rounds):
        await pair()
    return cpu_s(pid) - c0, time.perf_counter() - t0


async def _store_pair(store: PostgresGovernanceStore, principal: Any, now: datetime,
                   n: int) -> None:
    decisions = await store._admit_now(batch_requests(principal, now, n))
    items = exact_settlements([d for d in decisions if isinstance(d, Permit)])
    if n == 1:  # the lone calls, as a gateway at concurrency 1 makes them
        await store._settle_one(*items[0])
    else:
        await store._settle_many(items)


async def _floor_pair(pool: AsyncConnectionPool[Any], n: int, folded: bool) -> None:
    async with pool.connection() as conn:
        [(ids,)] = await (await conn.execute("SELECT floor_admit(%s, %s)",
                                             (n, folded))).fetchall()
        await conn.execute("SELECT floor_settle(%s, %s)", (ids, folded))


async def run(dsn: str, sizes: list[int], pairs: int) -> None:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1,
                                   kwargs={"autocommit": True}) as setup:
        async with setup.connection() as conn:
            await conn.execute(FLOOR)
        principal = await team_principal(setup, "t", LIMITS)
    now = datetime.now(UTC)
    print(f"{'batch':>5} {'calls':<22} {'PG CPU per pair':>16} {'wall per pair':>14}")
    for n in sizes:
        rounds = max(60, pairs // n)
        gateway = "gateway calls"
        for label in (gateway, "floor, segments as rows", "floor, segments folded"):
            # Its own connection: plans cached by this case only.
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                dsn, min_size=1, max_size=1, open=False, kwargs={"autocommit": True})
            await pool.open(wait=True)
            store = PostgresGovernanceStore(pool)

            pair = (partial(_store_pair, store, principal, now, n) if label == gateway
                    else partial(_floor_pair, pool, n, label.endswith("folded")))
            cpu, wall = await _timed(pool, pair, rounds)
            await pool.close()
            ops = rounds * n
            print(f"{n:>5} {label:<22} {cpu / ops * 1e3:13.3f} ms {wall / ops * 1e3:11.3f} ms",
                  flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--pairs", type=int, default=1600, help="operations per case")
    a = ap.parse_args()
    run_on_own_database("ipfloor", lambda dsn: run(dsn, a.sizes, a.pairs))


if __name__ == "__main__":
    main()
