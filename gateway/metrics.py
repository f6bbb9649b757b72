"""Prometheus metrics of one gateway process (served at ``/metrics``).

Each app gets its own registry, so several apps in one process (tests) never collide.
Money counters are integer µUSD; latency histograms are in seconds.

Budget utilisation is computed from what the request path already knows — each permit's
captured team day-µUSD charge (amount and limit) and each settlement's committed µUSD —
so it costs no database round trip. It is this process's view: in the shared profile
each replica reports the part of the team's day it admitted, so ``sum by (team_id)``
over replicas is the team's utilisation from the traffic they served since they started.

In the shared profile the ``mayu_cluster_*`` gauges (:mod:`gateway.cluster_metrics`)
add the database's own figures, the same on every replica: each money budget's day and
month utilisation, pending permits, frozen counters. Settlement latency (the store's
round trip) and upstream time to first byte are histograms beside admission latency.

With ``server.workers`` > 1 every worker keeps its values in prometheus-client's
multiprocess files (``PROMETHEUS_MULTIPROC_DIR``, set by the supervisor) and ``/metrics``
serves their sum: counters and histograms add up, the gauges sum the live workers.

Label sets are bounded: requests are labelled by route *template* (the ingress's
``route_label``), and teams by a pseudonym (:func:`team_pseudonym`, the first 16 hex
digits of the id's SHA-256, with an empty ``team`` label) unless
``server.metrics_team_labels`` asks for the real id and name (``Metrics(team_labels=True)``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.cluster_metrics import ClusterView
from gateway.governance import CounterKey, Permit, Settlement, UsageRow

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1, 2.5, 5, 10, 30, 60)
# The policy sources' failure log lines, by the sync error kind they count as.
_SYNC_ERRORS = (("policy refresh failed", "refresh_failed"),
                ("policy reload failed", "refresh_failed"),
                ("policy files rejected", "rejected"),
                ("policy LISTEN connection", "listen_failed"))
POLICY_LOGGERS = ("mayu.policy", "gateway.policy")
CREDENTIALS_LOGGER = "mayu.credentials"
CREDENTIAL_FAILURE = "credential refresh failed"
"""How a credential source's failure line starts (``gateway.providers._credentials``)."""
MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"
"""Set by ``mayu serve`` for its workers (``server.workers`` > 1): prometheus-client keeps
each worker's values in files there, and ``/metrics`` serves their sum."""


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, *, team_labels: bool = False) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.admissions = Counter("mayu_admissions", "Admission decisions by outcome "
                                  "(admitted, refused_429, refused_402, refused_503, error).",
                                  ["outcome"], registry=r)
        self.settlements = Counter("mayu_settlements", "Settlements by outcome kind.",
                                   ["kind"], registry=r)
        self.reserved_usd = Counter("mayu_reserved_micro_usd",
                                    "µUSD reserved by admitted permits (bounds).", registry=r)
        self.committed_usd = Counter("mayu_committed_micro_usd",
                                     "µUSD committed by settlements (what the upstream "
                                     "reported, priced exactly).", registry=r)
        self.liability_usd = Counter("mayu_liability_micro_usd",
                                     "µUSD of liability left by uncertain settlements (the "
                                     "unobserved remainder of their bounds; not spend).",
                                     registry=r)
        self.bound_exceeded = Counter("mayu_bound_exceeded",
                                      "Settlements whose valid usage exceeded the admitted "
                                      "bound (committed in full), by model.", ["model"],
                                      registry=r)
        self.settle_backlog = Gauge("mayu_settlement_backlog",
                                    "Settlements journaled and waiting for the governance "
                                    "store (replayed in order).", registry=r,
                                    multiprocess_mode="livesum")
        self.outstanding_usd = Gauge("mayu_reserved_outstanding_micro_usd",
                                     "µUSD reserved by this process's permits not yet "
                                     "settled.", registry=r, multiprocess_mode="livesum")
        self._outstanding: dict[str, int] = {}
        """Permit id → µUSD bound of the permits this process admitted and the store has
        not yet taken the settlement of: what ``outstanding_usd`` sums. A settlement of
        any other permit — one a previous run left in the journal, resolved at start-up
        or adopted from an orphaned journal — was never added, so it takes nothing off."""
        self.admission_latency = Histogram("mayu_admission_seconds",
                                           "Time to admit or refuse one attempt.",
                                           buckets=_LATENCY_BUCKETS, registry=r)
        self.upstream_latency = Histogram("mayu_upstream_seconds",
                                          "Time to upstream response headers, by provider.",
                                          ["provider"], buckets=_LATENCY_BUCKETS, registry=r)
        self.first_byte_latency = Histogram(
            "mayu_upstream_first_byte_seconds", "Time from sending a request upstream to "
            "the first byte of its response body (a stream's first event), by provider.",
            ["provider"], buckets=_LATENCY_BUCKETS, registry=r)
        self.settlement_latency = Histogram(
            "mayu_settlement_seconds", "Time the governance store took to take one "
            "settlement (or fail to).", buckets=_LATENCY_BUCKETS, registry=r)
        self.budget_alerts = Counter(
            "mayu_budget_alerts", "Budget alert events this replica claimed and emitted "
            "(one per budget, window and threshold across replicas), by threshold.",
            ["threshold"], registry=r)
        self.alert_deliveries = Counter(
            "mayu_budget_alert_deliveries", "Budget alert webhook deliveries by result "
            "(delivered, failed: after every retry).", ["result"], registry=r)
        self.alert_check_errors = Counter(
            "mayu_budget_alert_check_errors", "Budget alert checks the store could not "
            "answer (retried with backoff).", registry=r)
        self.snapshot_retries = Counter(
            "mayu_snapshot_retries", "Admissions re-planned after a snapshot mismatch, by "
            "what changed (key, team, policy).", ["changed"], registry=r)
        self.sync_errors = Counter("mayu_policy_sync_errors",
                                   "Policy source refresh failures, by kind.", ["kind"],
                                   registry=r)
        self.credential_failures = Counter(
            "mayu_credential_refresh_failures", "Provider credential refreshes that failed "
            "(STS, a token endpoint), by provider; the cause is in the log.", ["provider"],
            registry=r)
        self.requests = Counter("mayu_requests", "Requests by route and status.",
                                ["route", "status"], registry=r)
        self.budget = BudgetView(Gauge(
            "mayu_budget_utilisation_ratio", "(committed + reserved) / limit of each team's "
            "day µUSD window, from this process's admissions and settlements.",
            ["team_id", "team"], registry=r, multiprocess_mode="livesum"),
            team_labels=team_labels)
        self.cluster = ClusterView(pseudonym=team_pseudonym, team_labels=team_labels)
        r.register(self.cluster)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.input_refinements = Counter(
            "mayu_input_refinements", "Input-bound refinements (docs/bounds.md) by provider "
            "and outcome: cached, counted_prefix, counted, failed (the provider's count); "
            "tokenized (OpenAI's encoding, in a worker thread); not_needed (admitted on the "
            "byte bound by a deployment that could count).",
            ["provider", "outcome"], registry=r)
        self.input_refinement_latency = Histogram(
            "mayu_input_refinement_seconds", "Time one input-bound refinement step took "
            "(cache lookup, count call, threaded tokenizer count), by provider and "
            "outcome.", ["provider", "outcome"],
            buckets=(0.0001, 0.00025, *_LATENCY_BUCKETS), registry=r)

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, remembered: the request path asks for the same few
        label sets every time, and prometheus-client's ``labels`` (validation, a lock)
        costs more than the ``inc`` it precedes. Label values are bounded sets here
        (route templates, statuses, kinds, providers), so the memo is too; a child is
        still created on first use, so the exposition is unchanged."""
        key = (id(metric), labels)
        got = self._children.get(key)
        if got is None:
            got = self._children[key] = metric.labels(*labels)
        return got

    def request_done(self, route: str, status: int) -> None:
        """One request answered: ``mayu_requests_total{route, status}``."""
        self.child(self.requests, route, str(status)).inc()

    def admitted(self, permit: Permit, team_name: str) -> None:
        self.child(self.admissions, "admitted").inc()
        self.reserved_usd.inc(permit.request.usd_bound)
        if permit.id not in self._outstanding:
            self._outstanding[permit.id] = permit.request.usd_bound
            self.outstanding_usd.inc(permit.request.usd_bound)
        self.budget.admitted(permit, team_name)

    def settled(self, permit: Permit, settlement: Settlement, stored: bool) -> None:
        """``stored`` False: the store has not taken it yet (the journal replays it)."""
        self.child(self.settlements, str(settlement.kind)).inc()
        if not stored:
            return
        self.committed_usd.inc(settlement.usd_committed)
        self.liability_usd.inc(settlement.usd_liability)
        bound = self._outstanding.pop(permit.id, None)
        if bound is not None:
            self.outstanding_usd.dec(bound)
        self.budget.settled(permit, settlement.usd_committed + settlement.usd_liability)

    def first_byte(self, chunks: AsyncIterator[bytes], provider: str,
                   elapsed_s: float) -> AsyncIterator[bytes]:
        """``chunks``, observing the time to its first chunk (``elapsed_s``: the time
        the response headers took, already spent)."""
        started = time.perf_counter() - elapsed_s
        return _FirstChunk(chunks, lambda: self.child(self.first_byte_latency, provider).observe(
            time.perf_counter() - started))

    async def scrape(self) -> bytes:
        """The exposition, after refreshing the cluster gauges if they are stale."""
        await self.cluster.refresh()
        return self.render()

    def render(self) -> bytes:
        if not os.environ.get(MULTIPROCESS_DIR):
            return generate_latest(self.registry)
        # A worker of `mayu serve` with server.workers > 1: every worker's values, from
        # the files they share (gauges summed over the live workers), and the cluster
        # gauges this one reads.
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        registry.register(self.cluster)
        return generate_latest(registry)

    def policy_log_handler(self) -> logging.Handler:
        """A handler for the policy sources' loggers that counts their sync failures."""
        return _SyncErrorCounter(self.sync_errors)

    def credentials_log_handler(self) -> logging.Handler:
        """A handler for ``mayu.credentials`` that counts refresh failures by provider."""
        return _CredentialFailureCounter(self.credential_failures)


class _FirstChunk:
    """An async iterator that calls ``first`` when its first chunk arrives."""

    def __init__(self, inner: AsyncIterator[bytes], first: Callable[[], None]) -> None:
        self._inner = inner
        self._first: Callable[[], None] | None = first

    def __aiter__(self) -> _FirstChunk:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._inner.__anext__()
        if self._first is not None:
            first, self._first = self._first, None
            first()
        return chunk


class _SyncErrorCounter(logging.Handler):
    def __init__(self, counter: Counter) -> None:
        super().__init__(level=logging.WARNING)
        self._counter = counter

    def emit(self, record: logging.LogRecord) -> None:
        message = str(record.msg)
        for prefix, kind in _SYNC_ERRORS:
            if message.startswith(prefix):
                self._counter.labels(kind).inc()
                return


class _CredentialFailureCounter(logging.Handler):
    def __init__(self, counter: Counter) -> None:
        super().__init__(level=logging.WARNING)
        self._counter = counter

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith(CREDENTIAL_FAILURE):
            self._counter.labels(str(getattr(record, "provider", "unknown"))).inc()


@dataclass
class _TeamDay:
    day: str
    limit: int | None = None
    reserved: int = 0
    committed: int = 0
    name: str | None = None


class BudgetView:
    """Per team: this process's reserved and committed µUSD in the current UTC day."""

    def __init__(self, gauge: Gauge, *, team_labels: bool = False) -> None:
        self._gauge = gauge
        self._team_labels = team_labels
        self._teams: dict[str, _TeamDay] = {}
        self._children: dict[tuple[str, str], Any] = {}

    def seed(self, rows: list[UsageRow], day: str) -> None:
        """Start from the store's totals (local profile: this process is the only one)."""
        for row in rows:
            if row.scope == "team" and row.window == "day" and row.period == day:
                self._teams[row.id] = _TeamDay(day=day, reserved=row.usd_reserved,
                                               committed=row.usd_committed)

    @staticmethod
    def _day_charge(permit: Permit) -> tuple[str, int, int | None] | None:
        """(day, amount, limit) of the permit's team day-µUSD window, if it has one."""
        team_id = permit.request.team_id
        for c in permit.request.charges:
            if c.window is None or c.dimension != "usd":
                continue
            counter = CounterKey.parse(c.counter)
            if (counter is not None and counter.subject == "team" and counter.id == team_id
                    and counter.measure == "usd" and counter.window == "day"):
                return c.window, c.amount, c.limit
        return None

    def _entry(self, team_id: str, day: str) -> _TeamDay:
        entry = self._teams.get(team_id)
        if entry is None or entry.day < day:  # a new UTC day starts from zero
            entry = self._teams[team_id] = _TeamDay(day=day)
        return entry

    def admitted(self, permit: Permit, team_name: str) -> None:
        charge = self._day_charge(permit)
        if charge is None:
            return
        day, amount, limit = charge
        entry = self._entry(permit.request.team_id, day)
        if entry.day != day:  # admitted under a day that is already over here
            return
        entry.reserved += amount
        entry.limit, entry.name = limit, team_name
        self._publish(permit.request.team_id, entry)

    def settled(self, permit: Permit, usd_committed: int) -> None:
        charge = self._day_charge(permit)
        entry = self._teams.get(permit.request.team_id)
        if charge is None or entry is None or entry.day != charge[0]:
            return
        entry.reserved = max(0, entry.reserved - charge[1])
        entry.committed += usd_committed
        self._publish(permit.request.team_id, entry)

    def _publish(self, team_id: str, entry: _TeamDay) -> None:
        if entry.limit and entry.name is not None:
            labels = ((team_id, entry.name) if self._team_labels
                      else (team_pseudonym(team_id), ""))
            child = self._children.get(labels)
            if child is None:  # one per team (and name): remembered, as Metrics.child
                child = self._children[labels] = self._gauge.labels(*labels)
            child.set((entry.committed + entry.reserved) / entry.limit)


@lru_cache(maxsize=65536)
def team_pseudonym(team_id: str) -> str:
    """The ``team_id`` label by default: stable per team, not the id or the name
    (``printf %s <id> | sha256sum | cut -c1-16`` finds a team's series)."""
    return hashlib.sha256(team_id.encode()).hexdigest()[:16]
