"""Cluster-wide gauges, read from the shared database at scrape time (cached briefly).

Every replica exports the same figures — the database's, not its own traffic's — so a
dashboard or alert rule takes ``max`` over replicas, never ``sum``:

- ``mayu_cluster_budget_utilisation_ratio{scope, id, team, window, figure}``: each money
  budget of the current day and month with a limit (``scope`` ``key``, ``team`` or
  ``policy``), its ``committed``, ``liability`` and ``reserved`` µUSD over its limit.
  ``committed`` + ``liability`` is what the 80/90/100 % budget alerts compare (the
  figures that bind besides what is in flight);
- ``mayu_cluster_budget_limit_micro_usd{scope, id, team, window}``: that limit, and
  ``mayu_cluster_budget_remaining_micro_usd{…}`` what it has left (the limit less
  committed, liability and reserved; 0 at or past it);
- ``mayu_cluster_pending_permits`` and ``mayu_cluster_oldest_pending_permit_seconds``:
  permits admitted by any replica and not yet settled;
- ``mayu_cluster_frozen_counters``: money windows and accounts frozen by invalid usage;
- ``mayu_cluster_figures_age_seconds``: how old the figures served are (they are read at
  most every ``ttl_s``, 5 s by default; a failed read keeps the previous figures and
  this age grows).

Label sets are bounded by configuration, not traffic: one series per budget with a limit
in the current windows, at most ``max_budgets`` (the most used first;
``mayu_cluster_budgets_omitted`` counts the rest). The ``id`` of a budget follows
``server.metrics_team_labels``: by default the first 16 hex digits of the SHA-256 of the
key id, team id (the same pseudonym as ``mayu_budget_utilisation_ratio``) or policy
account (``<rule uid>:<scope>``, which holds team names and users), with an empty
``team`` label; with the option, the ids themselves and the team's name.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.governance import CounterKey

log = logging.getLogger("mayu.metrics")

_BUDGET_LABELS = ["scope", "id", "team", "window"]
_FIGURES = ("committed", "liability", "reserved")


@dataclass(frozen=True)
class BudgetFigures:
    counter: str
    limit: int
    committed: int
    liability: int
    reserved: int
    team_name: str | None = None


@dataclass(frozen=True)
class ClusterFigures:
    budgets: list[BudgetFigures] = field(default_factory=list)
    pending_permits: int = 0
    oldest_pending_s: float = 0.0
    frozen: int = 0


Reader = Callable[[str, str], Awaitable[ClusterFigures]]
"""(day, month) → the figures; raises when the database cannot answer."""


def postgres_reader(pool: Any) -> Reader:
    """A :data:`Reader` over the shared pool (``sql/alert_queries.sql``)."""
    import sql
    from gateway.db import connection, fetch_all, fetch_one

    async def read(day: str, month: str) -> ClusterFigures:
        async with connection(pool, "cluster metrics") as conn:
            rows = await fetch_all(conn, sql.alert_queries["cluster_budgets"],
                                   {"day": day, "month": month})
            keys = {r["counter"]: CounterKey.parse(r["counter"]) for r in rows}
            teams = sorted({k.id for k in keys.values() if k is not None and k.owner == "team"})
            names = {t["id"]: t["name"] for t in await fetch_all(
                conn, sql.alert_queries["cluster_team_names"], {"ids": teams})} if teams else {}
            status = await fetch_one(conn, sql.alert_queries["cluster_status"])
        assert status is not None
        return ClusterFigures(
            budgets=[BudgetFigures(counter=r["counter"], limit=int(r["limit"]),
                                   committed=int(r["committed"]),
                                   liability=int(r["liability"]),
                                   reserved=int(r["reserved"]),
                                   team_name=_team_name(keys[r["counter"]], names))
                     for r in rows],
            pending_permits=int(status["pending_permits"]),
            oldest_pending_s=float(status["oldest_pending_s"]),
            frozen=int(status["frozen"]))

    return read


def _team_name(key: CounterKey | None, names: dict[str, str]) -> str | None:
    """A team window's team name; None for a key's or a policy account's budget."""
    return names.get(key.id) if key is not None and key.owner == "team" else None


def _budget_labels(counter: str) -> tuple[str, str, str]:
    """(scope, subject, window) of a budget: ``key``/``team`` and its id, ``member`` and
    ``<team id>:<user>``, ``user`` and the user name, or ``policy``
    and ``<rule uid>:<scope>`` of an account; ``day`` or ``month``. A counter that is not
    a counter key is labelled ``policy`` with the whole string as subject."""
    budget = CounterKey.parse(counter)
    if budget is None:
        return "policy", counter, ""
    if budget.owner == "member":
        return "member", f"{budget.id}:{budget.scope}", budget.window or ""
    if budget.owner == "user":
        return "user", budget.scope, budget.window or ""
    subject = budget.id if budget.owner != "policy" else f"{budget.id}:{budget.scope}"
    return budget.owner, subject, budget.window or ""


class ClusterView(Collector):
    """The collector behind the ``mayu_cluster_*`` gauges (see the module docstring)."""

    def __init__(self, *, pseudonym: Callable[[str], str], team_labels: bool = False,
                 ttl_s: float = 5.0, max_budgets: int = 1000) -> None:
        self.reader: Reader | None = None
        """Set by the app in the shared profile; None: the families are exported empty."""
        self._pseudonym = pseudonym
        self._team_labels = team_labels
        self._ttl = ttl_s
        self._max = max_budgets
        self._figures: ClusterFigures | None = None
        self._read_at = 0.0
        self._tried_at = 0.0
        self._lock = asyncio.Lock()
        self.reads = 0
        """Database reads made (tests: the cache holds)."""

    async def refresh(self) -> None:
        """Read the database if the figures are older than ``ttl_s`` (one reader at a
        time; concurrent scrapes share its answer). A failure keeps the old figures."""
        if self.reader is None or time.monotonic() - self._tried_at < self._ttl:
            return
        async with self._lock:
            if time.monotonic() - self._tried_at < self._ttl:
                return
            self._tried_at = time.monotonic()
            now = datetime.now(UTC)
            try:
                self.reads += 1
                self._figures = await self.reader(now.strftime("%Y-%m-%d"),
                                                  now.strftime("%Y-%m"))
                self._read_at = time.monotonic()
            except Exception as exc:
                log.warning("cluster metrics: database read failed: %s", exc)

    def _labels(self, b: BudgetFigures) -> list[str]:
        scope, subject, window = _budget_labels(b.counter)
        team = (b.team_name or "") if self._team_labels and scope == "team" else ""
        ident = subject if self._team_labels else self._pseudonym(subject)
        return [scope, ident, team, window]

    def _families(self) -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily("mayu_cluster_budget_utilisation_ratio",
                              "Each money budget's committed, liability and reserved µUSD "
                              "over its limit (current day and month, from the database; "
                              "committed + liability is what the budget alerts compare).",
                              labels=[*_BUDGET_LABELS, "figure"]),
            GaugeMetricFamily("mayu_cluster_budget_limit_micro_usd",
                              "Each money budget's limit in µUSD (current windows).",
                              labels=_BUDGET_LABELS),
            GaugeMetricFamily("mayu_cluster_budget_remaining_micro_usd",
                              "What each money budget has left in µUSD: its limit less "
                              "committed, liability and reserved (0 at or past it).",
                              labels=_BUDGET_LABELS),
            GaugeMetricFamily("mayu_cluster_budgets_omitted",
                              "Budgets with a limit not exported (beyond the series cap)."),
            GaugeMetricFamily("mayu_cluster_pending_permits",
                              "Permits admitted by any replica and not yet settled."),
            GaugeMetricFamily("mayu_cluster_oldest_pending_permit_seconds",
                              "Age of the oldest pending permit (0 when none)."),
            GaugeMetricFamily("mayu_cluster_frozen_counters",
                              "Money windows and accounts frozen by invalid usage."),
            GaugeMetricFamily("mayu_cluster_figures_age_seconds",
                              "Age of the cluster figures served (read every few seconds)."),
        ]

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ratio, limit, remaining, omitted, pending, oldest, frozen, age = self._families()
        figures = self._figures
        if figures is not None:
            budgets = sorted(figures.budgets, reverse=True,
                             key=lambda b: (b.committed + b.liability) / b.limit)
            for b in budgets[: self._max]:
                labels = self._labels(b)
                for name in _FIGURES:
                    ratio.add_metric([*labels, name], getattr(b, name) / b.limit)
                limit.add_metric(labels, b.limit)
                remaining.add_metric(
                    labels, max(0, b.limit - b.committed - b.liability - b.reserved))
            omitted.add_metric([], max(0, len(budgets) - self._max))
            pending.add_metric([], figures.pending_permits)
            oldest.add_metric([], figures.oldest_pending_s)
            frozen.add_metric([], figures.frozen)
            age.add_metric([], time.monotonic() - self._read_at)
        return iter([ratio, limit, remaining, omitted, pending, oldest, frozen, age])
