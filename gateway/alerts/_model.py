"""What a budget alert is: a money budget, the thresholds it reached, the event.

A money budget is a µUSD window (a key's or team's day or month) or a policy account
with a limit. It *reaches* a threshold (80, 90, 100 % — ADR-050) when its committed +
liability, the figures that bind admission besides what is in flight, is at least that
share of its limit; integer arithmetic only (``(committed + liability) * 100 >= limit *
threshold``). Reserved amounts do not count: they are released or turned into spend
at settlement, which is when the binding figures move.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from gateway.governance import CounterKey

THRESHOLDS = (80, 90, 100)
"""Percentages of a budget's limit that emit one event each per window (ADR-050)."""


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    """One money budget a settled permit charged (from the permit's captured charge)."""

    counter: str
    kind: Literal["window", "account"]
    window: str
    """The calendar period: ``2026-11-29`` or ``2026-11``."""
    limit: int
    """The limit captured at admission (a store may prefer the counter's current one)."""


class AlertEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A threshold reached, claimed by one replica (the one that delivers it)."""

    counter: str
    window: str
    threshold: int
    limit: int
    committed: int
    liability: int
    reserved: int
    replica: str
    first_seen_at: str

    @property
    def id(self) -> str:
        """Stable across deliveries: a receiver deduplicates retries by it."""
        return f"{self.counter}/{self.threshold}"

    @property
    def scope(self) -> Literal["key", "team", "member", "user", "policy"]:
        """Whose budget: ``key``, ``team``, ``member`` (a user's within a team), ``user``
        (a user's across teams) or ``policy`` (a policy account)."""
        budget = CounterKey.parse(self.counter)
        return "policy" if budget is None else budget.owner

    @property
    def period(self) -> str:
        """The budget's calendar window: ``day`` or ``month``."""
        budget = CounterKey.parse(self.counter)
        return "" if budget is None or budget.window is None else budget.window

    def body(self) -> bytes:
        """The webhook's JSON body (the bytes the signature covers)."""
        return msgspec.json.encode({
            "type": "budget_alert", "id": self.id, "counter": self.counter,
            "scope": self.scope, "period": self.period, "window": self.window,
            "threshold": self.threshold, "limit": self.limit, "committed": self.committed,
            "liability": self.liability, "reserved": self.reserved,
            "first_seen_at": self.first_seen_at, "replica": self.replica})


class CheckResult(msgspec.Struct, frozen=True, kw_only=True):
    claimed: list[AlertEvent]
    """Events this check inserted first: this replica delivers them."""
    crossed: list[tuple[str, int]]
    """Every (counter, threshold) reached, claimed now or earlier by any replica."""


def thresholds_reached(committed: int, liability: int, limit: int) -> list[int]:
    """The thresholds a budget with these figures has reached (none without a limit)."""
    if limit <= 0:
        return []
    spent = (committed + liability) * 100
    return [t for t in THRESHOLDS if spent >= limit * t]
