"""Exact bucket refill from database time: the SQL agrees with gateway.governance._plan.

Every step is checked against the previous stored row and the database's own recorded
time (``updated_us``), so the comparison is exact, not approximate.
"""

from __future__ import annotations

import random

from gateway.governance import (
    BUCKET_SCALE,
    Permit,
    PostgresGovernanceStore,
    bucket_settle,
    refill,
)
from gateway.keys import PostgresKeyStore, TeamLimits
from gateway.pricing import Usage
from tests.integration._pg_helpers import principal, request
from tests.settling import exact, settlement

CAP = 6_000


async def test_bucket_follows_plan_arithmetic_and_never_exceeds_capacity(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """200 random admissions and true-ups (incl. debt): every stored balance equals the
    Python formula applied to the previous row and the DB-time delta, and stays <= capacity."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, limits=TeamLimits(tpm=CAP))
    name = f"team:{p.team.id}:tpm"
    rng = random.Random(46)
    open_permits: list[tuple[Permit, int, int]] = []
    prev = None
    granted = refused = debt_seen = 0
    for i in range(200):
        if open_permits and rng.random() < 0.5:
            permit, bound, admitted_us = open_permits.pop(rng.randrange(len(open_permits)))
            actual = rng.randint(0, bound * 2)  # sometimes more than reserved: debt
            out = exact(Usage(output=actual).total_tokens(), 0)
            await gov.settle(permit.id, settlement(permit.request, out))
            row = await gov.counter(name)
            assert row["updated_us"] >= prev["updated_us"]
            expected = bucket_settle(
                refill(prev["balance"], CAP, row["updated_us"] - prev["updated_us"]),
                CAP, bound, actual, held_us=row["updated_us"] - admitted_us)
        else:
            amount = rng.randint(1, CAP // 3)
            [decision] = await gov.admit([request(p, tokens=amount, rid=str(i))])
            row = await gov.counter(name)
            if isinstance(decision, Permit):
                granted += 1
                open_permits.append((decision, amount, row["updated_us"]))
                if prev is None:  # a new bucket is born full at its first admission
                    prev = {"balance": CAP * BUCKET_SCALE, "updated_us": row["updated_us"]}
                expected = refill(prev["balance"], CAP,
                                  row["updated_us"] - prev["updated_us"]) - amount * BUCKET_SCALE
            else:
                refused += 1
                assert decision.status == 429 and decision.retry_after >= 1
                expected = prev["balance"]
        assert row["balance"] == expected, i
        assert row["balance"] <= CAP * BUCKET_SCALE
        debt_seen += row["balance"] < 0
        prev = row
    assert granted and refused and debt_seen  # the sequence exercised every branch
