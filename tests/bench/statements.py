"""Where a batch's Postgres time goes, statement by statement (a script, not a test).

The gateway's admission and settlement calls (``PostgresGovernanceStore`` as a gateway
opens it) are run against a throwaway Postgres cluster of this script's own, started
with ``pg_stat_statements`` loaded and ``pg_stat_statements.track = all``, so every SQL
statement a PL/pgSQL function runs is timed on its own. For each batch size N
(``--sizes``): ``--batches`` calls of N admissions, the statistics read, then the same
permits settled exactly, N per call, and the statistics read again. Each phase prints:

- the call's mean execution time (the top-level ``SELECT inferplane_...(...)``);
- each statement the call ran, its time per call, and its share of the call;
- what no statement accounts for: the functions' own procedural work (PL/pgSQL
  assignments, loops, array and jsonb building, function entry with its ``SET``s) and
  each statement's executor start-up and shut-down, which ``pg_stat_statements`` does not
  time (``tests/bench/exprinit.py`` sizes two parts of it).

A batch spreads its requests over ``--teams`` teams (1: one hot team; 8 with N = 8: every
request its own team's rows, as the hot-team bench's spread load sends them). Times are
execution times with ``track = all``'s own cost included (a few µs per statement), so
compare shares within one run, not with the other benches' CPU figures.

    .venv/bin/python tests/bench/statements.py [--sizes 1 8] [--teams 8] [--batches 300]

Needs the PostgreSQL server binaries (``/usr/lib/postgresql/*/bin``, as ``scripts/test``
finds them); as root the cluster runs as the ``postgres`` OS user.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.governance import Permit, PostgresGovernanceStore  # noqa: E402
from tests.bench._bench import (  # noqa: E402
    batch_requests,
    exact_settlements,
    team_principal,
)
from tests.bench.floor import LIMITS  # noqa: E402
from tests.conftest import create_database, dsn_for, migrate  # noqa: E402

STATS = """
SELECT s.toplevel, s.calls, s.total_exec_time, regexp_replace(s.query, '\\s+', ' ', 'g')
  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
 WHERE d.datname = current_database()
"""


@contextmanager
def stats_cluster() -> Iterator[str]:
    """A throwaway cluster with every statement timed; its server DSN."""
    bindirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bindirs:
        raise SystemExit("statements.py: no PostgreSQL server binaries (/usr/lib/postgresql/*/bin)")
    bindir = Path(bindirs[-1])
    work = Path(tempfile.mkdtemp(prefix="ipstats."))
    as_pg: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to the postgres user
        shutil.chown(work, "postgres")
        as_pg = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = work / "data"
    subprocess.run([*as_pg, str(bindir / "initdb"), "-D", str(data), "-A", "trust",
                    "-U", "postgres"], check=True, stdout=subprocess.DEVNULL)
    options = (f"-p {port} -k {work} -c listen_addresses=127.0.0.1"
               " -c shared_preload_libraries=pg_stat_statements"
               " -c pg_stat_statements.track=all -c pg_stat_statements.max=5000")
    subprocess.run([*as_pg, str(bindir / "pg_ctl"), "-D", str(data), "-l",
                    str(work / "log"), "-w", "-o", options, "start"], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_pg, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                        "stop"], stdout=subprocess.DEVNULL, check=False)
        shutil.rmtree(work, ignore_errors=True)


async def _stats(pool: AsyncConnectionPool[Any]) -> dict[tuple[bool, str], tuple[int, float]]:
    async with pool.connection() as conn:
        rows = await (await conn.execute(STATS)).fetchall()
    return {(top, q): (calls, ms) for top, calls, ms, q in rows}


def _report(phase: str, n: int, before: dict[tuple[bool, str], tuple[int, float]],
            after: dict[tuple[bool, str], tuple[int, float]], calls: int, top: int) -> None:
    delta = {k: (c - before.get(k, (0, 0.0))[0], ms - before.get(k, (0, 0.0))[1])
             for k, (c, ms) in after.items()}
    entry = [(k, v) for k, v in delta.items() if k[0] and "inferplane_" in k[1] and v[0]]
    nested = sorted(((k, v) for k, v in delta.items() if not k[0] and v[0]),
                    key=lambda kv: -kv[1][1])
    call_us = sum(ms for _, (_, ms) in entry) / calls * 1e3
    names = ", ".join(sorted({m for (_, q), _ in entry
                              for m in re.findall(r"SELECT (inferplane_\w+)\(", q)}))
    print(f"\n{phase}, batches of {n}: {call_us:8.1f} µs per call ({names}), "
          f"{call_us / n:6.1f} µs per request")
    accounted = 0.0
    for (_, q), (c, ms) in nested[:top]:
        us = ms / calls * 1e3
        accounted += us
        print(f"  {us:8.1f} µs {us / call_us:6.1%}  x{c / calls:<5.1f} {q[:88]}")
    rest = sum(ms for _, (_, ms) in nested[top:]) / calls * 1e3
    print(f"  {rest:8.1f} µs {rest / call_us:6.1%}         the other {max(0, len(nested) - top)}"
          " statements")
    own = call_us - accounted - rest
    print(f"  {own:8.1f} µs {own / call_us:6.1%}         no statement: procedural work,"
          " statement start-up")


async def run(dsn: str, sizes: list[int], teams: int, batches: int,
              top: int) -> None:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False,
                                   kwargs={"autocommit": True}) as pool:
        principals = [await team_principal(pool, f"t{t}", LIMITS) for t in range(teams)]
        store = PostgresGovernanceStore(pool)
        now = datetime.now(UTC)

        def batch(n: int) -> list[Any]:
            return [r for j in range(n)
                    for r in batch_requests(principals[j % teams], now, 1)]

        async def admit(n: int) -> list[Permit]:
            decisions = await store._admit_now(batch(n))
            permits = [d for d in decisions if isinstance(d, Permit)]
            if len(permits) != n:
                raise RuntimeError(f"refused in the bench: {decisions}")
            return permits

        async def settle(permits: list[Permit]) -> None:
            items = exact_settlements(permits)
            if len(items) == 1:  # the lone call, as a gateway at concurrency 1 makes it
                await store._settle_one(*items[0])
            else:
                await store._settle_many(items)

        print(f"{teams} team(s), {batches} calls per phase")
        for n in sizes:
            for _ in range(20):  # plans cached, caches warm
                await settle(await admit(n))
            s0 = await _stats(pool)
            held = [await admit(n) for _ in range(batches)]
            s1 = await _stats(pool)
            for permits in held:
                await settle(permits)
            s2 = await _stats(pool)
            _report("admission", n, s0, s1, batches, top)
            _report("settlement", n, s1, s2, batches, top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--teams", type=int, default=8, help="teams a batch spreads over")
    ap.add_argument("--batches", type=int, default=300, help="calls per phase")
    ap.add_argument("--top", type=int, default=10, help="statements listed per phase")
    a = ap.parse_args()
    with stats_cluster() as server:
        create_database(server, "ipstats")
        dsn = dsn_for(server, "ipstats")
        migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        asyncio.run(run(dsn, a.sizes, a.teams, a.batches, a.top))


if __name__ == "__main__":
    main()
