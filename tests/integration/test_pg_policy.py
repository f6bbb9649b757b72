"""Policy generations in Postgres: publish, current, changes, and the gateway's source."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from gateway.errors import NotFound
from gateway.governance import Permit, PostgresGovernanceStore, Refusal
from gateway.keys import PostgresKeyStore
from gateway.policy import (
    PolicyInvalid,
    PostgresPolicySource,
    changes,
    current,
    publish,
)
from tests.integration._pg_helpers import principal, request
from tests.settling import exact, settlement


def doc(name: str, **budget: Any) -> dict[str, Any]:
    body = budget or {"limitMilliUSD": 5, "window": "day"}
    return {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
            "metadata": {"name": name},
            "spec": {"rules": [{"name": "cap", "subject": {"kind": "team", "team": "t1"},
                                "failurePolicy": "FailClosed", "budget": body}]}}


async def test_publish_bumps_generation_and_records_changes(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """Each accepted write is a new generation with fingerprint, author and change rows."""
    async with pg_pool.connection() as conn:
        empty = await current(conn)
        assert (empty.generation, empty.documents) == (0, {})
        first = await publish(conn, put={"a": doc("a")}, author="alice")
        second = await publish(conn, put={"b": doc("b")}, delete=["a"], author="bob")
        now = await current(conn)
        log = await changes(conn, since=1)
        everything = await changes(conn)
    assert (first.generation, second.generation) == (1, 2)
    assert first.namespace == empty.namespace == second.namespace
    assert now.documents == {"b": doc("b")} and now.author == "bob"
    assert now.fingerprint == second.fingerprint != first.fingerprint
    assert [(c.name, c.action, c.author) for c in log] == [("a", "delete", "bob"),
                                                           ("b", "put", "bob")]
    assert log[0].before == doc("a") and log[0].after is None
    assert len(everything) == 3


async def test_invalid_set_changes_nothing(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """A set that does not compile raises PolicyInvalid with paths; nothing is published."""
    async with pg_pool.connection() as conn:
        await publish(conn, put={"a": doc("a")}, author="alice")
        with pytest.raises(PolicyInvalid) as info:
            await publish(conn, put={"b": doc("b", limitMilliUSD=-1, window="day")},
                          author="mallory")
        with pytest.raises(NotFound):
            await publish(conn, delete=["nope"], author="mallory")
        now = await current(conn)
    assert any(path.startswith("b:") for path, _ in info.value.problems)
    assert (now.generation, list(now.documents)) == (1, ["a"])


async def test_identical_publish_is_idempotent(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """Re-publishing the same set returns the current generation without a new one."""
    async with pg_pool.connection() as conn:
        first = await publish(conn, put={"a": doc("a")}, author="alice")
        again = await publish(conn, put={"a": doc("a")}, author="alice")
        assert again == first
        assert len(await changes(conn)) == 1


async def test_source_follows_notify_and_admission_checks_generation(pg_pool, pg_dsn) -> None:  # type: ignore[no-untyped-def]
    """A published generation reaches a running source (LISTEN); a request captured at the
    old generation is refused with 503, one at the new generation is charged its rule."""
    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, team="t1")
    source = PostgresPolicySource(pg_pool, refresh_s=60.0)  # 60 s: only a notify is fast
    await source.start()
    try:
        before = source.snapshot()
        assert before.generation == 0 and before.namespace != "local"
        # Published through a different connection, as inferplaned would.
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            await publish(conn, put={"a": doc("a")}, author="alice")
        for _ in range(500):
            if source.snapshot().generation == 1:
                break
            await asyncio.sleep(0.01)
        after = source.snapshot()
        assert after.generation == 1 and [r.uid for r in after.rules] == ["a/cap"]
    finally:
        await source.stop()
    [stale] = await gov.admit([request(p, snapshot=before)])
    assert isinstance(stale, Refusal) and stale.status == 503
    [fresh] = await gov.admit([request(p, usd=5_000, snapshot=after)])
    assert isinstance(fresh, Permit)
    assert any(c.kind == "account" for c in fresh.request.charges)
    [over] = await gov.admit([request(p, usd=1, snapshot=after)])
    assert isinstance(over, Refusal) and over.status == 402


async def test_settlement_after_the_rule_is_deleted_uses_the_captured_account(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """Admitted under a published budget rule, settled after that policy was deleted: the
    rule's account still gets the commitment and its reservation back."""

    keys, gov = PostgresKeyStore(pg_pool), PostgresGovernanceStore(pg_pool)
    p = await principal(keys, team="t1")
    source = PostgresPolicySource(pg_pool, refresh_s=60.0)
    async with pg_pool.connection() as conn:
        await publish(conn, put={"a": doc("a", limitMilliUSD=10, window="month")},
                      author="alice")
    await source.refresh()
    req = request(p, usd=4_000, snapshot=source.snapshot())
    [permit] = await gov.admit([req])
    assert isinstance(permit, Permit)
    [account] = [c.counter for c in req.charges if c.kind == "account"]
    async with pg_pool.connection() as conn:
        await publish(conn, delete=["a"], author="bob")
    await source.refresh()
    assert source.snapshot().rules == ()
    out = exact(10, 1_500)
    await gov.settle(permit.id, settlement(req, out))
    row = await gov.counter(account)
    assert (row["committed"], row["reserved"], row["limit"]) == (1_500, 0, 10_000)
    [after] = await gov.admit([request(p, usd=4_000, snapshot=source.snapshot())])
    assert isinstance(after, Permit)
    assert not any(c.kind == "account" for c in after.request.charges)
