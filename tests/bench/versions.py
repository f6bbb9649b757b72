"""SQL versions side by side (a script, not a test): the Postgres CPU of an admit + settle
pair through each ``PostgresGovernanceStore(functions=...)``, interleaved on one
database, in one run.

Each version gets its own connection (its own backend, so its own cached plans). For
each batch size N (``--sizes``) the versions take turns, ``--rounds`` times: a block of
``--block`` pairs each — N requests of one team charging four counters (RPM and TPM
buckets, day token and µUSD windows) admitted in one call, then settled exactly in one
call (a lone request: the lone calls, as a gateway at concurrency 1 makes them). The
backend's user + system CPU (``/proc/<pid>/stat``) over its blocks, divided by its
operations, is printed per version, with the ratio to the first version. Interleaving
in short blocks puts every version on the same machine state and the same table sizes,
which on a box whose speed moves with its neighbours' load is what makes two versions
comparable. ``--merged``: each operation is instead one merged call (v3 and later), as a
busy gateway sends them: the N permits the previous call admitted settled, and N more
admitted, in one transaction.

    .venv/bin/python tests/bench/versions.py [--versions 7 8] [--sizes 1 4 16] [--merged]

Uses ``INFERPLANE_TEST_PG_DSN`` to create, migrate and drop its own database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.governance import Permit, PostgresGovernanceStore  # noqa: E402
from tests.bench._bench import (  # noqa: E402
    batch_requests,
    cpu_s,
    exact_settlements,
    own_database,
    team_principal,
)
from tests.bench.floor import LIMITS, _store_pair  # noqa: E402


async def _merged_op(store: PostgresGovernanceStore, principal: Any, now: datetime, n: int,
                     held: list[Permit]) -> None:
    """One merged call: settle the permits the previous call admitted, admit n more."""
    _, decisions = await store._settle_admit(exact_settlements(held),
                                             batch_requests(principal, now, n))
    held[:] = [d for d in decisions if isinstance(d, Permit)]


async def run(dsn: str, versions: list[int], sizes: list[int], rounds: int,
              block: int, merged: bool) -> None:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1,
                                   kwargs={"autocommit": True}) as setup:
        principal = await team_principal(setup, "t", LIMITS)
    now = datetime.now(UTC)
    print(f"{'batch':>5} {'SQL':<4} {'PG CPU per pair':>16} {'vs first':>9}"
          + ("  (merged calls)" if merged else ""))
    for n in sizes:
        arms: list[tuple[int, PostgresGovernanceStore, int]] = []
        pools: list[AsyncConnectionPool[Any]] = []
        for fn in versions:
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                dsn, min_size=1, max_size=1, open=False, kwargs={"autocommit": True})
            await pool.open(wait=True)
            pools.append(pool)
            async with pool.connection() as conn:
                [(pid,)] = await (await conn.execute("SELECT pg_backend_pid()")).fetchall()
            arms.append((fn, PostgresGovernanceStore(pool, functions=fn), pid))
        held: dict[int, list[Permit]] = {fn: [] for fn in versions}

        def op(fn: int, store: PostgresGovernanceStore, n: int = n,
               held: dict[int, list[Permit]] = held) -> Any:
            return (_merged_op(store, principal, now, n, held[fn]) if merged
                    else _store_pair(store, principal, now, n))
        for fn, store, _ in arms:  # plans cached, caches warm
            for _ in range(max(10, block // 2)):
                await op(fn, store)
        cpu = {fn: 0.0 for fn in versions}
        for _ in range(rounds):
            for fn, store, pid in arms:
                c0 = cpu_s(pid)
                for _ in range(block):
                    await op(fn, store)
                cpu[fn] += cpu_s(pid) - c0
        for pool in pools:
            await pool.close()
        ops = rounds * block * n
        first = cpu[versions[0]]
        for fn in versions:
            print(f"{n:>5} v{fn:<3} {cpu[fn] / ops * 1e3:13.3f} ms {cpu[fn] / first:9.2f}",
                  flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, nargs="+", default=[7, 8])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=40, help="pairs per turn")
    ap.add_argument("--merged", action="store_true",
                    help="each operation one merged call (settle n, admit n)")
    a = ap.parse_args()
    with own_database("ipvers") as dsn:
        asyncio.run(run(dsn, a.versions, a.sizes, a.rounds, a.block, a.merged))


if __name__ == "__main__":
    main()
