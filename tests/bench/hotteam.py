"""Hot-team bench (a script, not a test): admissions per second of the shared profile
from THREE gateway processes on one database, next to the raw single-row commit rate
measured the same way in the same run.

Each of ``--processes`` processes opens its own pool and ``PostgresGovernanceStore``
(``coalesce`` and ``settle_coalesce``: the gateway's ``database.admission_coalesce`` and
``settlement_coalesce``; each ``--settings`` pair measured side by side) and runs
``--workers`` asyncio workers, each looping admit → settle (what one request costs the
database: the team's TPM bucket, day token window and day µUSD window charged, a permit
with its segments written, then settled exactly) for ``--seconds``. A setting's fourth
field 1 runs it answer first, as a gateway answers by default (``server.settle_wait_s``
0): a worker's next admission goes while its settlement is being taken.
The raw loop is the same processes and workers doing ``UPDATE bench_raw
SET v = v + 1 WHERE id = …; COMMIT`` on one row (hot) or 100 rows (spread). Spread:
each worker of all the processes loops over its own share of the 100 teams (rows), so
no two workers wait on each other's row locks. The processes run on uvloop when it is
installed, as a gateway replica does. Phases
alternate (raw, each setting, …) for ``--rounds``; medians are printed with the ratio
admissions/raw, and how many requests and settlements the store's calls carried on
average (its ``tally``).

``--floors`` adds phases to the spread load that do only the row work a pair cannot
avoid (``FLOOR_SQL``: the same locks and row writes with the fewest statements, no JSON,
no snapshot check, no decision), batched by the gateway's own coalescers, to show what
ratio any design that writes a permit per request could reach at this many requests in
flight: ``rows`` with today's schema, ``folded`` with the segments kept in the permit
row, ``team-row`` with that and a team's counters kept as one row. The run checks that
the floors left nothing reserved or pending.

    .venv/bin/python tests/bench/hotteam.py [--processes 3] [--workers 8] [--seconds 4] \
        [--settings 1,1 1,1,1 1,1,0,1 1,1,1,1] [--floors rows folded team-row]

Uses ``INFERPLANE_TEST_PG_DSN`` to create, migrate and drop its own database.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.governance import Permit, PostgresGovernanceStore, build_request  # noqa: E402
from gateway.governance._coalesce import Coalescer, SettlementCoalescer  # noqa: E402
from gateway.keys import PostgresKeyStore, TeamLimits, hash_key  # noqa: E402
from gateway.policy import EMPTY_SNAPSHOT  # noqa: E402
from gateway.pricing import Usage  # noqa: E402
from tests.bench._bench import cpu_s, machine_ms, own_database  # noqa: E402
from tests.settling import exact, settlement  # noqa: E402

LIMITS = TeamLimits(tpm=1 << 35, tokens_per_day=1 << 49, usd_micros_per_day=1 << 49)

# The floors (``--floors``): what a pair cannot avoid writing, through the same harness
# (processes, workers, the gateway's coalescers, raw loop beside it). Per request: the
# key, team and policy rows FOR SHARE, the team's counter rows FOR UPDATE in byte order
# and updated, a permit inserted (admission); the permits locked and updated, the
# counters locked and updated again (settlement). ``rows``: the three counters and three
# permit_segments rows per request, as today's schema has them; ``folded``: the segments
# kept in a jsonb column of the permit; ``team-row``: that, and the team's three
# counters kept as one row (both schema changes a redesign would need). No JSON
# arguments, no snapshot check, no decisions, no answers: a lower bound for any design
# that writes a permit per request, not a design. Spread load only: a call reserves and
# releases each counter row once, which is exact only when no two of its requests share
# a team (so the check after the rounds would not hold for one hot team).
FLOOR_SQL = """
ALTER TABLE permits ADD COLUMN floor_segments jsonb;
INSERT INTO counters (key, kind, dimension, "window")
     SELECT 'floor:' || t.id || ':' || g, 'window', 'tokens', 'd'
       FROM teams t, generate_series(0, 3) g;
CREATE FUNCTION floor_admit(p_keys text[], p_teams text[], p_variant text) RETURNS uuid[]
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    ids uuid[] := array(SELECT gen_random_uuid() FROM unnest(p_teams));
    ks text[] := array(SELECT 'floor:' || t || ':' || g FROM unnest(p_teams) t,
                              generate_series(CASE WHEN p_variant = 'team-row' THEN 0
                                                   ELSE 1 END,
                                              CASE WHEN p_variant = 'team-row' THEN 0
                                                   ELSE 3 END) g);
BEGIN
    PERFORM 1 FROM keys WHERE id = ANY(p_keys) ORDER BY id FOR SHARE;
    PERFORM 1 FROM teams WHERE id = ANY(p_teams) ORDER BY id FOR SHARE;
    PERFORM 1 FROM policy_state FOR SHARE;
    PERFORM 1 FROM counters WHERE key = ANY(ks) ORDER BY key COLLATE "C" FOR UPDATE;
    UPDATE counters SET reserved = reserved + 1 WHERE key = ANY(ks);
    INSERT INTO permits (id, request_id, key_id, team_id, model, token_bound, usd_bound,
                         generation, day, month, admitted_us, floor_segments)
    SELECT x.id, 'r', x.k, x.t, 'm', 500, 2000, 0, '2026-12-01', '2026-12', 0,
           CASE WHEN p_variant <> 'rows' THEN (SELECT jsonb_agg(jsonb_build_object(
               'counter', 'floor:' || x.t || ':' || g, 'kind', 'window',
               'dimension', 'tokens', 'amount', 1)) FROM generate_series(1, 3) g) END
      FROM unnest(ids, p_keys, p_teams) AS x(id, k, t);
    IF p_variant = 'rows' THEN
        INSERT INTO permit_segments (permit_id, counter, kind, dimension, amount)
        SELECT x.id, 'floor:' || x.t || ':' || g, 'window', 'tokens', 1
          FROM unnest(ids, p_teams) AS x(id, t), generate_series(1, 3) g;
    END IF;
    RETURN ids;
END $$;
CREATE FUNCTION floor_settle(p_ids uuid[], p_variant text) RETURNS void
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
DECLARE
    ks text[];
BEGIN
    PERFORM 1 FROM permits WHERE id = ANY(p_ids) ORDER BY id FOR UPDATE;
    IF p_variant = 'rows' THEN
        ks := array(SELECT counter FROM permit_segments WHERE permit_id = ANY(p_ids));
        UPDATE permit_segments SET committed = 1 WHERE permit_id = ANY(p_ids);
        UPDATE permits SET status = 'complete', tokens_committed = 1, usd_committed = 1,
               settled_at = clock_timestamp()
         WHERE id = ANY(p_ids);
    ELSE
        WITH u AS (
            UPDATE permits SET status = 'complete', tokens_committed = 1,
                   usd_committed = 1, settled_at = clock_timestamp(),
                   floor_segments = (SELECT jsonb_agg(e || '{"committed": 1}')
                                       FROM jsonb_array_elements(floor_segments) e)
             WHERE id = ANY(p_ids) RETURNING team_id)
        SELECT array_agg(CASE WHEN p_variant = 'team-row' THEN 'floor:' || u.team_id || ':0'
                              ELSE 'floor:' || u.team_id || ':' || g END)
          INTO ks
          FROM u, generate_series(1, CASE WHEN p_variant = 'team-row' THEN 1 ELSE 3 END) g;
    END IF;
    PERFORM 1 FROM counters WHERE key = ANY(ks) ORDER BY key COLLATE "C" FOR UPDATE;
    UPDATE counters SET reserved = reserved - 1, committed = committed + 1
     WHERE key = ANY(ks);
END $$;
"""
FLOORS = ("rows", "folded", "team-row")


def _store(pool: AsyncConnectionPool, coalesce: int, settle_coalesce: int,
           merge: int) -> PostgresGovernanceStore:
    # Only what the store of this checkout takes (the bench also runs from an older
    # commit's checkout, speed.py --baseline style).
    params = inspect.signature(PostgresGovernanceStore).parameters
    kwargs: dict[str, int] = {"coalesce": coalesce}
    if settle_coalesce and "settle_coalesce" in params:
        kwargs["settle_coalesce"] = settle_coalesce
    if merge and "merge" in params:
        kwargs["merge"] = merge
    return PostgresGovernanceStore(pool, **kwargs)  # type: ignore[arg-type]


def _owned(worker: int, workers: int, n: int) -> list[int]:
    """The rows (teams) one worker loops over: worker ``worker`` of ``workers`` in all
    owns every ``workers``-th of ``n``, so two workers never share one while there are
    at least as many rows as workers (spread: none waits on another's row lock), and
    every row is used (hot: ``n`` = 1, all share it)."""
    return list(range(worker % n, n, workers)) or [worker % n]


async def _child(dsn: str, mode: str, keys: list[str], workers: int, seconds: float,
                 coalesce: int, settle_coalesce: int, merge: int,
                 answer_first: int, upstream_ms: float, start_at: float, index: int,
                 processes: int) -> tuple[int, float, tuple[int, int, int, int]]:
    async with AsyncConnectionPool(dsn, min_size=workers, max_size=workers,
                                   kwargs={"autocommit": True}) as pool:
        ops = 0
        gov: PostgresGovernanceStore | None = None
        if mode.startswith("raw"):
            rows = 1 if mode == "raw-hot" else 100

            async def step(w: int, turn: int) -> int:
                owned = _owned(w, workers * processes, rows)
                async with pool.connection() as conn:
                    await conn.execute("UPDATE bench_raw SET v = v + 1 WHERE id = %s",
                                       (owned[turn % len(owned)],))
                return 1
        elif mode.startswith("floor-"):
            floor = await _floor_step(pool, mode.removeprefix("floor-"), keys, workers,
                                      processes)

            async def step(w: int, turn: int) -> int:
                return await floor(w, turn)
        else:
            ks = PostgresKeyStore(pool)
            principals = [await ks.resolve(hash_key(k)) for k in keys]
            gov = _store(pool, coalesce, settle_coalesce, merge)
            now = datetime.now(UTC)
            pending: dict[int, asyncio.Future[object] | None] = {
                index * workers + w: None for w in range(workers)}

            async def step(w: int, turn: int) -> int:
                owned = _owned(w, workers * processes, len(principals))
                principal = principals[owned[turn % len(owned)]]
                assert principal is not None
                req = build_request(principal, EMPTY_SNAPSHOT, request_id=f"h{w}", model="m",
                                    token_bound=500, usd_bound=2_000, now=now)
                [d] = await gov.admit([req])
                if not isinstance(d, Permit):
                    raise RuntimeError(f"refused: {d}")
                if upstream_ms:  # the upstream call a permit is held for, 0..2x the mean
                    await asyncio.sleep(random.random() * 2 * upstream_ms / 1e3)
                settling = gov.settle(d.id, settlement(req, exact(
                    Usage(input=300, output=100).total_tokens(), 1_234)))
                if not answer_first:
                    await settling
                    return 1
                # As a gateway answers (server.settle_wait_s 0): the settlement is taken
                # while the worker's next request is admitted; a worker has at most one
                # settlement in flight, and a pair counts when its settlement is taken.
                before = pending[w]
                if before is not None:
                    await before
                pending[w] = asyncio.ensure_future(settling)
                return 0 if before is None else 1

        while time.time() < start_at:
            await asyncio.sleep(0.005)
        stop = time.monotonic() + seconds
        cpu0 = time.process_time()

        async def worker(w: int) -> None:
            nonlocal ops
            turn = 0
            while time.monotonic() < stop:
                done = await step(w, turn)  # not `ops += await ...`: that loses updates
                ops += done
                turn += 1
        # Worker numbers are unique across the processes (the process's index, not its
        # pid: a pid-based offset that is a multiple of the row count maps every
        # process's workers onto the same rows).
        await asyncio.gather(*(worker(index * workers + w) for w in range(workers)))
        cpu = time.process_time() - cpu0
        if mode == "gov":  # the settlements still in flight: taken, not counted
            await asyncio.gather(*(f for f in pending.values() if f is not None))
        # What the store's calls carried (a store without a tally: the baseline's).
        t = getattr(gov, "tally", None)
        batches = ((t.admitted, t.admission_calls, t.settled, t.settlement_calls)
                   if t is not None else (0, 0, 0, 0))
        return ops, cpu, batches


async def _floor_step(pool: AsyncConnectionPool, variant: str, keys: list[str],
                      workers: int, processes: int
                      ) -> Callable[[int, int], Coroutine[Any, Any, int]]:
    """One floor pair per step, batched by the gateway's own coalescers (one admission
    and one settlement call in flight, as ``1,1``)."""
    ks = PostgresKeyStore(pool)
    principals = [await ks.resolve(hash_key(k)) for k in keys]

    async def admit(requests: list[tuple[str, str]]) -> list[str]:
        async with pool.connection() as conn:
            row = await (await conn.execute(
                "SELECT floor_admit(%s, %s, %s)",
                ([k for k, _ in requests], [t for _, t in requests], variant))).fetchone()
        assert row is not None
        return [str(i) for i in row[0]]

    async def settle_many(items: list[tuple[str, object]]) -> list[object]:
        async with pool.connection() as conn:
            await conn.execute("SELECT floor_settle(%s::uuid[], %s)",
                               ([p for p, _ in items], variant))
        return [None] * len(items)

    async def settle_one(permit_id: str, _: object) -> object:
        return (await settle_many([(permit_id, None)]))[0]

    async def no_refund(_: object) -> None:
        return None

    admissions = Coalescer(admit, no_refund, max_in_flight=1)  # type: ignore[arg-type]
    settlements = SettlementCoalescer(settle_one, settle_many,  # type: ignore[arg-type]
                                      max_in_flight=1)

    async def step(w: int, turn: int) -> int:
        owned = _owned(w, workers * processes, len(principals))
        principal = principals[owned[turn % len(owned)]]
        assert principal is not None
        [pid] = await admissions.admit([(principal.key_id, principal.team_id)])  # type: ignore[list-item]
        await settlements.settle(pid, None)  # type: ignore[arg-type]
        return 1
    return step


Result = tuple[int, float, tuple[int, int, int, int]]


def _run_child(args: tuple[object, ...], out: mp.Queue[Result]) -> None:
    # The event loop a gateway replica runs on: uvicorn takes uvloop when it is installed
    # (it is a dependency), and psycopg's async waits cost about half as much on it.
    try:
        import uvloop
    except ImportError:
        out.put(asyncio.run(_child(*args)))  # type: ignore[arg-type]
        return
    out.put(uvloop.run(_child(*args)))  # type: ignore[arg-type]


def _backends(dsn: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = "
                            "current_database() AND pid <> pg_backend_pid()").fetchall()
    return [r[0] for r in rows]


class Phase:
    """One phase's rate and CPU per operation (bench processes; their Postgres
    backends, read from /proc over the timed window)."""

    def __init__(self, ops: int, seconds: float, client_s: float, pg_s: float,
                 batches: tuple[int, int, int, int] = (0, 0, 0, 0)) -> None:
        self.rate = ops / seconds
        self.client_ms = client_s * 1e3 / max(ops, 1)
        self.pg_ms = pg_s * 1e3 / max(ops, 1)
        admitted, admit_calls, settled, settle_calls = batches
        self.admit_batch = admitted / admit_calls if admit_calls else 0.0
        """Mean requests per admission call (0: not counted)."""
        self.settle_batch = settled / settle_calls if settle_calls else 0.0


def phase(dsn: str, mode: str, keys: list[str], a: argparse.Namespace,
          setting: tuple[int, ...] = (0, 0, 0, 0)) -> Phase:
    ctx = mp.get_context("spawn")
    out: mp.Queue[Result] = ctx.Queue()
    start_at = time.time() + 3.0  # every process connected before the clock starts
    procs = [ctx.Process(target=_run_child, args=((dsn, mode, keys, a.workers, a.seconds,
                                                   *setting, a.upstream_ms, start_at, i,
                                                   a.processes), out))
             for i in range(a.processes)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    backends = _backends(dsn)
    pg0 = sum(cpu_s(b) for b in backends)
    time.sleep(max(0.0, start_at + a.seconds - 0.02 - time.time()))
    pg_s = sum(cpu_s(b) for b in backends) - pg0
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    batches = tuple(sum(r[2][i] for r in results) for i in range(4))
    return Phase(sum(r[0] for r in results), a.seconds, sum(r[1] for r in results), pg_s,
                 batches)  # type: ignore[arg-type]


async def _keys(dsn: str, teams: int) -> list[str]:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1,
                                   kwargs={"autocommit": True}) as pool:
        ks = PostgresKeyStore(pool)
        out = []
        for t in range(teams):
            await ks.create_team(name=f"team{t}", limits=LIMITS)
            plaintext, _ = await ks.create_key(team=f"team{t}")
            out.append(plaintext)
        return out


def _label(scope: str, c: int, sc: int, merge: int, first: int) -> str:
    return f"{scope} {c},{sc}" + (" merged" if merge else "") + (" first" if first else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--workers", type=int, default=8, help="per process")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--upstream-ms", type=float, default=0.0,
                    help="mean time a permit is held between admission and settlement "
                         "(the upstream call; uniform 0..2x), so workers fall out of step "
                         "as a gateway's requests do; 0: settle at once")
    ap.add_argument("--settings", nargs="+",
                    default=["1,1", "1,1,1", "1,1,0,1", "1,1,1,1"],
                    help="admission_coalesce,settlement_coalesce[,merge[,first]]] "
                         "measured side by side: merge 1 = admissions and "
                         "settlements waiting at once in one transaction (where "
                         "the store has it); first 1 = answer first, as a gateway "
                         "answers by default (server.settle_wait_s 0): a worker's next "
                         "admission does not wait for its settlement to be taken (at most "
                         "one in flight per worker; a pair counts when its settlement is "
                         "taken); 0: each settlement awaited")
    ap.add_argument("--floors", nargs="*", choices=FLOORS, default=[],
                    help="also run these floors beside the settings, each phase through "
                         "the gateway's coalescers (1,1), awaited: the fewest statements "
                         "doing the row work a pair cannot avoid, with the segments as "
                         "rows, folded into the permit, or that and the team's counters "
                         "in one row (see FLOOR_SQL); spread load only (a floor call "
                         "reserves once per counter row, exact only when no two of its "
                         "requests share a team); adds a column to the bench's own "
                         "database only")
    ap.add_argument("--loads", nargs="+", choices=("hot", "spread"),
                    default=["hot", "spread"], help="which loads to run (default both)")
    a = ap.parse_args()
    settings = [(*parts, *(0, 0)[len(parts) - 2:])
                for parts in (tuple(int(x) for x in pair.split(",")) for pair in a.settings)]
    load0, speed0 = os.getloadavg()[0], machine_ms()
    with own_database("iphot") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_raw (id int PRIMARY KEY, v bigint NOT NULL)")
            conn.execute("INSERT INTO bench_raw SELECT g, 0 FROM generate_series(0, 99) g")
        keys = asyncio.run(_keys(dsn, 100))
        if a.floors:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(FLOOR_SQL)
        rates: dict[str, list[Phase]] = {}
        for rnd in range(a.rounds):
            for scope, raw, ks in (("hot", "raw-hot", keys[:1]),
                                   ("spread", "raw-spread", keys)):
                if scope not in a.loads:
                    continue
                rates.setdefault(f"raw {scope}", []).append(phase(dsn, raw, ks, a))
                for setting in settings:
                    rates.setdefault(_label(scope, *setting), []).append(
                        phase(dsn, "gov", ks, a, setting))
                for floor in a.floors if scope == "spread" else ():
                    rates.setdefault(f"{scope} floor {floor}", []).append(
                        phase(dsn, f"floor-{floor}", ks, a))
            print(f"round {rnd + 1}/{a.rounds}: " + ", ".join(
                f"{k} {v[-1].rate:.0f}/s" for k, v in rates.items()), flush=True)
        if a.floors:  # every floor permit settled, every reservation released
            with psycopg.connect(dsn, autocommit=True) as conn:
                left = conn.execute(
                    "SELECT (SELECT coalesce(sum(reserved), 0) FROM counters"
                    "         WHERE key LIKE 'floor:%%'),"
                    "       (SELECT count(*) FROM permits WHERE request_id = 'r'),"
                    "       (SELECT count(*) FROM permits WHERE request_id = 'r'"
                    "           AND status = 'pending')").fetchone()
            assert left is not None
            if left[0] or left[2]:
                raise SystemExit(f"floors left {left[0]} reserved, {left[2]} pending permits")
            print(f"floors: {left[1]} permits settled, nothing reserved or pending")
    med = {k: statistics.median(p.rate for p in v) for k, v in rates.items()}
    cpu = {k: (statistics.median(p.client_ms for p in v), statistics.median(p.pg_ms for p in v))
           for k, v in rates.items()}
    print(f"\n{a.processes} processes x {a.workers} workers, {a.seconds:g} s per phase, "
          f"permits held {a.upstream_ms:g} ms on average; "
          f"load average {load0:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
          f"machine: {speed0:.0f} -> {machine_ms():.0f} ms per probe loop (tests/bench/_bench.py "
          f"machine_ms); "
          f"medians of {a.rounds} rounds")
    print(f"{'load':<7} {'coalesce adm,settle':>19} {'SQL':>9} {'settled':>8} "
          f"{'admit+settle/s':>15} "
          f"{'raw UPDATE;COMMIT/s':>20} {'ratio':>6}   CPU ms per op: bench, Postgres "
          f"(raw's); requests per call: admission, settlement")
    for scope in a.loads:
        raw_rate = med[f"raw {scope}"]
        for c, sc, mg, first in settings:
            label = _label(scope, c, sc, mg, first)
            rate = med[label]
            sql_label = "merged" if mg else "lone"
            (cm, pm), (rcm, rpm) = cpu[label], cpu[f"raw {scope}"]
            ab = statistics.median(p.admit_batch for p in rates[label])
            sb = statistics.median(p.settle_batch for p in rates[label])
            print(f"{scope:<7} {f'{c},{sc}':>19} {sql_label:>9} "
                  f"{'1st' if first else 'awaited':>8} {rate:15.0f} {raw_rate:20.0f} "
                  f"{rate / raw_rate:6.2f}   {cm:.3f}, {pm:.3f} ({rcm:.3f}, {rpm:.3f}); "
                  f"{ab:.1f}, {sb:.1f}")
        for floor in a.floors if scope == "spread" else ():
            label = f"{scope} floor {floor}"
            rate = med[label]
            (cm, pm), (rcm, rpm) = cpu[label], cpu[f"raw {scope}"]
            print(f"{scope:<7} {'1,1':>19} {'floor':>9} {floor:>8} {rate:15.0f} "
                  f"{raw_rate:20.0f} {rate / raw_rate:6.2f}   {cm:.3f}, {pm:.3f} "
                  f"({rcm:.3f}, {rpm:.3f})")


if __name__ == "__main__":
    main()
