"""Budget alert stores and webhook delivery, against real stores and a real HTTP server.

Both alert stores (shared Postgres ``alert_events``, local SQLite) see the same figures
the governance stores wrote: permits are admitted and settled through the real
governance store, then the alert store is asked which thresholds the budget reached
and which events this caller claims. Webhook deliveries go to a real local server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.alerts import (
    AlertEvent,
    AlertStore,
    Budget,
    BudgetAlerts,
    PostgresAlertStore,
    SqliteAlertStore,
    WebhookSender,
    moved_budgets,
    thresholds_reached,
)
from gateway.audit import AuditLog
from gateway.db import Pool
from gateway.governance import (
    GovernanceStore,
    LocalGovernanceStore,
    Outcome,
    OutcomeKind,
    PostgresGovernanceStore,
)
from gateway.keys import KeyLimits, PostgresKeyStore, Principal, Team, TeamLimits
from gateway.metrics import Metrics
from tests.integration._pg_helpers import principal
from tests.settling import exact, spend
from tests.webhook import WebhookReceiver

pytestmark = pytest.mark.integration

LIMIT = 10_000
NOW = datetime.now(UTC)


def _local_principal() -> Principal:
    return Principal(key_id="key_a", key_prefix="sk-inf-abcdef", key_revision=1,
                     key_limits=KeyLimits(), allowed_models=None, user=None,
                     team=Team(id="team_a", name="alpha",
                               limits=TeamLimits(usd_micros_per_day=LIMIT)))


@dataclass
class Stores:
    governance: GovernanceStore
    alerts: AlertStore
    principal: Principal

    @property
    def team_day(self) -> str:
        return f"team:{self.principal.team_id}:usd:day:{NOW:%Y-%m-%d}"


@pytest.fixture(params=["local", "shared"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path,
                 pg_pool: Pool) -> AsyncIterator[Stores]:
    if request.param == "shared":
        p = await principal(PostgresKeyStore(pg_pool), team="alpha",
                            limits=TeamLimits(usd_micros_per_day=LIMIT))
        yield Stores(PostgresGovernanceStore(pg_pool), PostgresAlertStore(pg_pool), p)
        return
    local = LocalGovernanceStore(str(tmp_path / "mayu.db"))
    await local.open()
    alerts = SqliteAlertStore(local.path)
    await alerts.open()
    try:
        yield Stores(local, alerts, _local_principal())
    finally:
        await alerts.close()
        await local.close()


async def _spend(stores: Stores, usd: int, *, liability: int = 0) -> list[Budget]:
    """Admit one permit for ``usd + liability`` and settle it: ``usd`` committed, the
    rest (if any) left as liability by an uncertain outcome. Returns its moved budgets."""
    cut = Outcome(kind=OutcomeKind.UNCERTAIN, detail="cut")
    permit, s = await spend(stores.governance, stores.principal, usd + liability,
                            cut if liability else exact(10, usd), now=NOW)
    assert s is not None
    if liability:
        assert s.usd_committed == 0 and s.usd_liability == usd + liability
    return moved_budgets(permit, s)


async def test_each_threshold_is_claimed_once(stores: Stores) -> None:
    """70 % reaches nothing; 80 % claims 80; the next check claims nothing but reports
    it reached; liability counts like committed (95 %: 90); 100 % claims 100."""
    budgets = await _spend(stores, 7_000)
    assert [b.counter for b in budgets] == [stores.team_day]
    first = await stores.alerts.check(budgets, replica="r0")
    assert first.claimed == [] and first.crossed == []
    await _spend(stores, 1_000)
    second = await stores.alerts.check(budgets, replica="r0")
    assert [(e.threshold, e.committed, e.liability, e.limit) for e in second.claimed] == \
        [(80, 8_000, 0, LIMIT)]
    again = await stores.alerts.check(budgets, replica="r1")
    assert again.claimed == [] and [t for _, t in again.crossed] == [80]
    await _spend(stores, 0, liability=1_500)
    third = await stores.alerts.check(budgets, replica="r1")
    assert [(e.threshold, e.liability, e.replica) for e in third.claimed] == \
        [(90, 1_500, "r1")]
    await _spend(stores, 500)
    last = await stores.alerts.check(budgets, replica="r2")
    assert [e.threshold for e in last.claimed] == [100]
    assert sorted(t for _, t in last.crossed) == [80, 90, 100]


async def test_a_delivery_is_recorded(stores: Stores) -> None:
    """delivered() records the outcome of an event's delivery without error."""
    budgets = await _spend(stores, 9_000)
    [e80, e90] = (await stores.alerts.check(budgets, replica="r0")).claimed
    await stores.alerts.delivered(e80, ok=True, attempts=1, error=None)
    await stores.alerts.delivered(e90, ok=False, attempts=6, error="HTTP 500")


async def test_concurrent_replicas_claim_each_event_exactly_once(pg_pool: Pool) -> None:
    """60 checks racing from 3 replicas over a budget at 100 % claim the three events
    exactly once between them, and the table holds three rows."""
    p = await principal(PostgresKeyStore(pg_pool), team="alpha",
                        limits=TeamLimits(usd_micros_per_day=LIMIT))
    alerts = PostgresAlertStore(pg_pool)
    budgets = await _spend(Stores(PostgresGovernanceStore(pg_pool), alerts, p), LIMIT)
    results = await asyncio.gather(*(alerts.check(budgets, replica=f"r{i % 3}")
                                      for i in range(60)))
    claimed = [e for r in results for e in r.claimed]
    assert sorted(e.threshold for e in claimed) == [80, 90, 100]
    async with pg_pool.connection() as conn:
        rows = await (await conn.execute("SELECT count(*) FROM alert_events")).fetchone()
    assert rows == {"count": 3}


def test_thresholds_are_integer_shares_of_the_limit() -> None:
    """Reached means (committed + liability) * 100 >= limit * threshold, exactly."""
    assert thresholds_reached(79, 0, 100) == []
    assert thresholds_reached(79, 1, 100) == [80]
    assert thresholds_reached(0, 90, 100) == [80, 90]
    assert thresholds_reached(2**50, 0, 2**50) == [80, 90, 100]
    assert thresholds_reached(7, 1, 10) == [80]
    assert thresholds_reached(5, 5, 0) == []  # no limit, no alert


def _event() -> AlertEvent:
    return AlertEvent(counter="team:t:usd:day:2026-12-01", window="2026-12-01", threshold=80,
                      limit=100, committed=80, liability=0, reserved=5, replica="r0",
                      first_seen_at="2026-12-01T10:00:00.000000Z")


async def test_webhook_is_signed_and_retried_until_it_lands() -> None:
    """A 500 then a 503 are retried; the third POST lands, with the body's HMAC in
    x-inferplane-signature and the event id, and the JSON carries the figures."""
    with WebhookReceiver(statuses=[500, 503]) as hook:
        sender = WebhookSender(hook.url, secret="s3cret", retries=3, retry_backoff_s=0.01)
        await sender.start()
        delivery = await sender.deliver(_event().body(), event_id=_event().id)
        await sender.close()
    assert delivery.ok and delivery.attempts == 3
    [got] = hook.received
    assert got.signed_with("s3cret") and not got.signed_with("other")
    assert got.headers["x-inferplane-event-id"] == "team:t:usd:day:2026-12-01/80"
    body = got.json()
    assert {k: body[k] for k in ("counter", "window", "threshold", "limit", "committed",
                                 "liability", "reserved", "scope", "period")} == {
        "counter": "team:t:usd:day:2026-12-01", "window": "2026-12-01", "threshold": 80,
        "limit": 100, "committed": 80, "liability": 0, "reserved": 5, "scope": "team",
        "period": "day"}


async def test_webhook_gives_up_after_its_retries_and_on_a_client_error() -> None:
    """A receiver answering 500 forever is tried 1 + retries times; a 400 is final."""
    with WebhookReceiver(statuses=[500] * 10) as hook:
        sender = WebhookSender(hook.url, secret="k", retries=2, retry_backoff_s=0.01)
        await sender.start()
        failed = await sender.deliver(b"{}", event_id="x")
        await sender.close()
    assert not failed.ok and failed.attempts == 3 and failed.error == "HTTP 500"
    assert hook.attempts == 3
    with WebhookReceiver(statuses=[400]) as hook:
        sender = WebhookSender(hook.url, secret="k", retries=5, retry_backoff_s=0.01)
        await sender.start()
        refused = await sender.deliver(b"{}", event_id="x")
        await sender.close()
    assert not refused.ok and refused.attempts == 1 and hook.attempts == 1


async def test_webhook_to_nowhere_fails_without_raising() -> None:
    """A connection refused is retried, then reported as a failed delivery."""
    with WebhookReceiver() as hook:
        url = hook.url
    sender = WebhookSender(url, secret="k", retries=1, retry_backoff_s=0.01, timeout_s=1)
    await sender.start()
    delivery = await sender.deliver(b"{}", event_id="x")
    await sender.close()
    assert not delivery.ok and delivery.attempts == 2
    assert delivery.error is not None and "Connect" in delivery.error


async def test_one_budgets_events_reach_the_webhook_in_threshold_order(
        tmp_path: Path) -> None:
    """One settlement takes a budget from 85 % to 100 %: one check claims 90 and 100
    together. The receiver refuses the first POST once; the 100 % event still lands
    after the 90 % one (each budget's deliveries wait for the one before)."""
    local = LocalGovernanceStore(str(tmp_path / "mayu.db"))
    await local.open()
    store = SqliteAlertStore(local.path)
    stores = Stores(local, store, _local_principal())
    audit = AuditLog(str(tmp_path / "audit.jsonl"))
    audit.open()
    with WebhookReceiver(statuses=[500]) as hook:
        alerts = BudgetAlerts(store, replica="r0", metrics=Metrics(), audit=audit,
                              webhook=WebhookSender(hook.url, secret="k", retries=2,
                                                    retry_backoff_s=0.05))
        await alerts.start()
        [budget] = await _spend(stores, 8_500)
        await store.check([budget], replica="r0")  # 80 % claimed before: not delivered
        permit, done = await spend(local, stores.principal, 1_500, exact(10, 1_500),
                                   now=NOW, request_id="last")
        assert done is not None
        alerts.settled(permit, done)
        hook.wait_for(2)
        await alerts.close()
    audit.close()
    await local.close()
    assert hook.attempts == 3
    assert [r.json()["threshold"] for r in hook.received] == [90, 100]
