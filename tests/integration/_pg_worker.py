"""A worker process for the multi-process admission tests.

``python -m tests.integration._pg_worker DSN KEY_HASH N_TASKS ROUNDS SEED`` resolves the
key through its own pool, runs N_TASKS concurrent admit→settle loops of ROUNDS each and
prints one JSON line: ``{"granted": n, "refused": {status: n}, "cost": µUSD, "tokens": n}``.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections import Counter
from datetime import UTC, datetime

from psycopg_pool import AsyncConnectionPool

from gateway.governance import (
    Permit,
    PostgresGovernanceStore,
    build_request,
)
from gateway.keys import PostgresKeyStore
from gateway.policy import EMPTY_SNAPSHOT
from gateway.pricing import Usage
from tests.settling import exact, settlement

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


async def cycles(gov: PostgresGovernanceStore, principal, rounds: int, rng: random.Random,  # type: ignore[no-untyped-def]
                 totals: dict) -> None:  # type: ignore[type-arg]
    for i in range(rounds):
        # Half token-heavy and cheap, half tiny and expensive: both the TPM bucket and
        # the money window run out during one test.
        if rng.random() < 0.5:
            bound_tokens, bound_usd = rng.randint(2_000, 5_000), rng.randint(100, 1_000)
        else:
            bound_tokens, bound_usd = rng.randint(10, 50), rng.randint(20_000, 80_000)
        req = build_request(principal, EMPTY_SNAPSHOT, request_id=f"w{i}", model="m",
                            token_bound=bound_tokens, usd_bound=bound_usd, now=NOW)
        [decision] = await gov.admit([req])
        if not isinstance(decision, Permit):
            totals["refused"][decision.status] += 1
            continue
        totals["granted"] += 1
        tokens, cost = rng.randint(0, bound_tokens), rng.randint(0, bound_usd)
        out = exact(Usage(output=tokens).total_tokens(), cost)
        await gov.settle(decision.id, settlement(req, out))
        totals["cost"] += cost
        totals["tokens"] += tokens


async def main(dsn: str, key_hash: str, tasks: int, rounds: int, seed: int) -> dict:  # type: ignore[type-arg]
    totals: dict = {"granted": 0, "refused": Counter(), "cost": 0, "tokens": 0}  # type: ignore[type-arg]
    async with AsyncConnectionPool(dsn, min_size=tasks, max_size=tasks,
                                   kwargs={"autocommit": True}) as pool:
        principal = await PostgresKeyStore(pool).resolve(key_hash)
        assert principal is not None
        gov = PostgresGovernanceStore(pool)
        await asyncio.gather(*(cycles(gov, principal, rounds, random.Random(seed * 1000 + t),
                                      totals) for t in range(tasks)))
    return totals


if __name__ == "__main__":
    dsn, key_hash, n_tasks, n_rounds, seed = sys.argv[1:6]
    result = asyncio.run(main(dsn, key_hash, int(n_tasks), int(n_rounds), int(seed)))
    print(json.dumps(result))
