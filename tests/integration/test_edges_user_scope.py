"""A ``kind: user`` policy rule charges each team's user apart, in both stores (issue 25).

A key's ``user`` is unique only within its team, so two teams' "ci" users are different
people: a ``kind: user`` budget gives each its own account
(``account:<uid>:team=<team>,user=<user>:…``), neither spends the other's budget, and a
refusal shows only the refused user's own figures. Through the store each profile opens
(the local SQLite pair, and the shared Postgres pair), with the rule compiled from a
real GovernancePolicy document.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.governance import Permit, Refusal
from gateway.policy import PolicySnapshot, compile_documents
from tests.integration._pg_helpers import principal, request, store_pair
from tests.settling import exact, settlement

pytestmark = pytest.mark.integration

LIMIT = 10_000  # µUSD: limitMilliUSD 10
DAY = "2026-11-29"  # tests.integration._pg_helpers.NOW


def _snapshot(user: str) -> PolicySnapshot:
    rules = compile_documents([{
        "apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
        "metadata": {"name": "people"},
        "spec": {"rules": [{"name": "daily", "failurePolicy": "FailClosed",
                            "subject": {"kind": "user", "user": user},
                            "budget": {"limitMilliUSD": LIMIT // 1000, "window": "day"}}]}}])
    return PolicySnapshot(generation=0, rules=rules)


@pytest.fixture(params=["local", "postgres"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path
                 ) -> AsyncIterator[tuple[Any, Any]]:
    async with store_pair(request.param, request, tmp_path, pool_max_size=2) as pair:
        yield pair

@pytest.mark.parametrize("user", ["ci", "*"])
async def test_two_teams_users_of_one_name_never_share_a_user_budget(
        stores: tuple[Any, Any], user: str) -> None:
    """Team a's "ci" spends 6,000 of a 10,000 µUSD ``kind: user`` budget; team b's "ci"
    still gets its own 6,000 admitted; team a's next 6,000 is refused 402 on team a's
    account with team a's figures only (committed 6,000, nothing of team b's reserved)."""
    keys, gov = stores
    snap = _snapshot(user)
    ci_a = await principal(keys, team="a", user="ci")
    ci_b = await principal(keys, team="b", user="ci")
    first = request(ci_a, usd=6_000, rid="a1", snapshot=snap)
    [permit] = await gov.admit([first])
    assert isinstance(permit, Permit), permit
    account_a = f"account:people/daily:team=a,user=ci:day:{DAY}"
    assert account_a in {c.counter for c in first.charges}
    await gov.settle(permit.id, settlement(first, exact(10, 6_000)))

    [other] = await gov.admit([request(ci_b, usd=6_000, rid="b1", snapshot=snap)])
    assert isinstance(other, Permit), other
    assert f"account:people/daily:team=b,user=ci:day:{DAY}" in {
        c.counter for c in other.request.charges}

    [refused] = await gov.admit([request(ci_a, usd=6_000, rid="a2", snapshot=snap)])
    assert isinstance(refused, Refusal), refused
    assert (refused.status, refused.code, refused.counter) == (402, "budget_exhausted",
                                                               account_a)
    assert refused.figures is not None
    assert (refused.figures.limit, refused.figures.committed, refused.figures.reserved,
            refused.figures.amount) == (LIMIT, 6_000, 0, 6_000)
    assert refused.reason == (f"{account_a}: limit {LIMIT} µUSD would be exceeded: committed "
                              "6000 + liability 0 + reserved 0 + this request's worst case "
                              "6000")
