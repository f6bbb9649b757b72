"""Budget alerts (ADR-050): one event per money budget, window and threshold.

:class:`BudgetAlerts` hangs off the Governor's ``on_settled`` hook. The hook costs the
settlement path no I/O: it only notes which money budgets with a limit the permit moved
(its captured charges whose commit or liability is not zero) and wakes one background
task. That task asks the store, in one round trip per batch (every budget noted since
its last question, however many settlements that was), which thresholds those budgets
reached and which of them this replica claims first (:mod:`._stores`). A budget known to
have reached 100 % is never asked about again in that window. After a question the task
waits ``check_interval_s`` (0.25 s) before the next: under load every settlement moves a
budget, and asking after each one cost ≈ 15 % of a busy local gateway's GIL samples (a thread
hop and a read transaction per check) for alerts that may as well be a quarter of a
second late.

For each claimed event: ``mayu_budget_alerts_total{threshold}``, an audit line
(``event: budget_alert``), a warning in the log and, with ``server.alerts.webhook_url``,
a signed POST (:mod:`._webhook`) whose outcome is recorded in the store. A store that
cannot answer keeps the budgets noted and is asked again with backoff (a crossing is
late, never lost while the process runs); nothing here ever fails a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from datetime import UTC, datetime
from typing import Any

from gateway.alerts._model import AlertEvent, Budget
from gateway.alerts._stores import AlertStore
from gateway.alerts._webhook import WebhookSender
from gateway.audit import AuditLog
from gateway.governance import CounterKey, Permit, Settlement, utc_windows
from gateway.metrics import Metrics

log = logging.getLogger("mayu.alerts")

_MAX_BACKOFF_S = 30.0


def _period_of(counter: str) -> str | None:
    budget = CounterKey.parse(counter)
    return None if budget is None else budget.period


def moved_budgets(permit: Permit, settlement: Settlement) -> list[Budget]:
    """The money budgets with a limit whose binding figures this settlement moved."""
    out: list[Budget] = []
    for c in permit.request.charges:
        if (c.dimension != "usd" or c.kind == "bucket" or not c.limit
                or c.window is None):
            continue
        if settlement.commits.get(c.counter, 0) + settlement.liabilities.get(c.counter, 0):
            out.append(Budget(counter=c.counter, kind="account" if c.kind == "account"
                              else "window", window=c.window, limit=c.limit))
    return out


class BudgetAlerts:
    """Detects threshold crossings after settlements and delivers the events."""

    def __init__(self, store: AlertStore, *, replica: str, metrics: Metrics,
                 audit: AuditLog, webhook: WebhookSender | None = None,
                 check_interval_s: float = 0.25) -> None:
        self.store = store
        self._interval_s = check_interval_s
        self._stop = asyncio.Event()
        self.replica = replica
        self._metrics = metrics
        self._audit = audit
        self._webhook = webhook
        self._pending: dict[str, Budget] = {}
        self._reached: dict[str, int] = {}
        """Highest threshold each budget (counter key, hence window) is known to have."""
        self._wake = asyncio.Event()
        self._closing = False
        self._worker: asyncio.Task[None] | None = None
        self._deliveries: set[asyncio.Task[None]] = set()
        self._last_delivery: dict[str, asyncio.Task[None]] = {}
        """Per counter, the delivery the next one waits for: a budget's events reach the
        webhook in threshold order even when one check claims 90 and 100 together."""
        self._day = ""
        self.checks = 0
        """Store round trips made (tests, docs: what the alerts cost)."""

    # -- the settlement hook (no I/O) ------------------------------------------------------

    def settled(self, permit: Permit, settlement: Settlement) -> None:
        for budget in moved_budgets(permit, settlement):
            if self._reached.get(budget.counter, 0) < 100:
                self._pending[budget.counter] = budget
        if self._pending:
            self._wake.set()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await self.store.open()
        if self._webhook is not None:
            await self._webhook.start()
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def close(self, *, grace_s: float = 5.0) -> None:
        """Check what is still noted once more, wait up to ``grace_s`` for deliveries."""
        self._closing = True
        self._wake.set()
        self._stop.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        if self._worker is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._worker), grace_s)
            except TimeoutError:
                self._worker.cancel()
                await asyncio.gather(self._worker, return_exceptions=True)
        if self._deliveries:
            left = max(0.0, deadline - loop.time())
            _, late = await asyncio.wait(list(self._deliveries), timeout=left or 0.01)
            for task in late:
                task.cancel()
            if late:
                log.warning("%d budget alert deliveries abandoned at shutdown", len(late))
                await asyncio.gather(*late, return_exceptions=True)
        if self._webhook is not None:
            await self._webhook.close()
        await self.store.close()

    # -- the checker -----------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = 1.0
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                if self._closing:
                    return
                continue
            batch, self._pending = self._pending, {}
            try:
                self.checks += 1
                result = await self.store.check(list(batch.values()), replica=self.replica)
            except Exception as exc:
                self._metrics.alert_check_errors.inc()
                if self._closing:
                    log.warning("budget alert check abandoned at shutdown: %s", exc)
                    return
                log.warning("budget alert check failed (retried in %.0f s): %s", backoff, exc)
                for counter, budget in batch.items():
                    self._pending.setdefault(counter, budget)
                await asyncio.sleep(backoff)
                backoff = min(_MAX_BACKOFF_S, backoff * 2)
                self._wake.set()
                continue
            backoff = 1.0
            self._forget_old_windows()
            for counter, threshold in result.crossed:
                self._reached[counter] = max(self._reached.get(counter, 0), threshold)
            for event in sorted(result.claimed, key=lambda e: (e.counter, e.threshold)):
                self._emit(event)
            if self._closing and not self._pending:
                return
            if self._interval_s > 0 and not self._closing:
                # What settles meanwhile is noted and asked about together (or at once
                # when closing).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self._interval_s)

    def _forget_old_windows(self) -> None:
        day, month = utc_windows(datetime.now(UTC))
        if day != self._day:
            self._day = day
            self._reached = {k: v for k, v in self._reached.items()
                             if _period_of(k) in (day, month)}

    def _emit(self, event: AlertEvent) -> None:
        self._metrics.budget_alerts.labels(str(event.threshold)).inc()
        fields: dict[str, Any] = {
            "event": "budget_alert", "counter": event.counter, "scope": event.scope,
            "period": event.period, "window": event.window, "threshold": event.threshold,
            "limit": event.limit, "committed": event.committed,
            "liability": event.liability, "reserved": event.reserved,
            "webhook": self._webhook is not None}
        self._audit.write(fields)
        log.warning("budget alert: %s reached %d%% of its %s limit (%d µUSD: committed "
                    "%d, liability %d, reserved %d)", event.counter, event.threshold,
                    event.window, event.limit, event.committed, event.liability,
                    event.reserved)
        if self._webhook is not None:
            before = self._last_delivery.get(event.counter)
            task = asyncio.get_running_loop().create_task(self._deliver(event, before))
            self._deliveries.add(task)
            self._last_delivery[event.counter] = task
            task.add_done_callback(functools.partial(self._delivery_done, event.counter))

    def _delivery_done(self, counter: str, task: asyncio.Task[None]) -> None:
        self._deliveries.discard(task)
        if self._last_delivery.get(counter) is task:
            del self._last_delivery[counter]

    async def _deliver(self, event: AlertEvent, before: asyncio.Task[None] | None) -> None:
        assert self._webhook is not None
        if before is not None:
            await asyncio.wait({before})  # not gather: cancelling this must not cancel it
        delivery = await self._webhook.deliver(event.body(), event_id=event.id)
        self._metrics.alert_deliveries.labels("delivered" if delivery.ok else "failed").inc()
        if not delivery.ok:
            log.error("budget alert %s: webhook delivery failed after %d attempt(s): %s",
                      event.id, delivery.attempts, delivery.error)
        try:
            await self.store.delivered(event, ok=delivery.ok, attempts=delivery.attempts,
                                       error=delivery.error)
        except Exception as exc:
            log.warning("budget alert %s: delivery not recorded: %s", event.id, exc)
