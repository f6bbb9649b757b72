"""The soft tier (ADR-046): whether a caller is past a soft budget, read cheaply.

A soft budget is a policy ``budget`` rule with ``hardCap: false``: admission never
refuses on it. Once one that binds the caller holds committed + liability at or above its
limit, routing sends the caller's requests to the model's ``routing.soft_tier``
deployments. Reserved amounts never count: a burst of admitted, unsettled requests is
not spend yet, and may end up far below its bounds (a reservation becomes committed or
liability only when it settles, or is found uncertain).

The figures are the store's own (the shared database in the shared profile, the SQLite
file in the local one), read through :meth:`GovernanceStore.figures` and kept per budget
account for ``soft_tier.max_age_s`` on this replica; concurrent requests of a caller
whose figures are stale wait for one read. So a switch lags the spend that passed the
limit by at most ``max_age_s`` plus the settlements still in flight at that moment.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Literal

import msgspec

from gateway.catalog import builtin_catalog
from gateway.config import ModelSettings, SoftTier, deployment_names
from gateway.governance import Charge, GovernanceStore

Tier = Literal["standard", "soft"]

_MAX_ACCOUNTS = 100_000
"""Budget accounts remembered at most per replica (then the cache starts afresh)."""


class TierChoice(msgspec.Struct, frozen=True, kw_only=True):
    """Which tier a request is routed to, and why."""

    tier: Tier
    budget: str | None = None
    """The soft budget's account (counter) the caller is past, if any."""
    kept: str | None = None
    """Past a soft budget but kept on the standard tier: which capability the soft tier
    lacks (``context window`` or ``tools``)."""


STANDARD = TierChoice(tier="standard")


def tier_window(model: ModelSettings, tier: SoftTier) -> int | None:
    """The soft tier's context window: its own setting, else its first deployment's
    upstream model in the built-in catalog (None: not known, no limit applied)."""
    if tier.max_input_tokens is not None:
        return tier.max_input_tokens
    names = {n: i for i, n in deployment_names(model).items()}
    first = model.deployments[names[tier.deployments[0]]]
    entry = builtin_catalog().get(first.upstream_model or model.name)
    return entry.max_input_tokens if entry is not None else None


def lacks(model: ModelSettings, tier: SoftTier, *, input_tokens: int,
          tools: bool) -> str | None:
    """The capability a request needs that the soft tier lacks (None: it can serve it)."""
    if tools and not tier.tools:
        return "tools"
    window = tier_window(model, tier)
    if window is not None and input_tokens > window:
        return "context window"
    return None


class SoftBudgets:
    """Soft budget figures as this replica last read them (module docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._seen: dict[str, tuple[float, bool]] = {}
        """Budget account → (when read, past its limit)."""
        self._reading: dict[tuple[str, ...], asyncio.Future[dict[str, bool]]] = {}

    async def past(self, store: GovernanceStore, charges: Sequence[Charge],
                   max_age_s: float) -> str | None:
        """The first of ``charges`` (soft budget accounts) whose committed + liability
        is at or above its limit, as read less than ``max_age_s`` ago (0: read now); None if
        none is."""
        now = self.clock()
        stale = tuple(c.counter for c in charges
                      if (seen := self._seen.get(c.counter)) is None
                      or now - seen[0] >= max_age_s)
        if stale:
            await self._read(store, [c for c in charges if c.counter in stale], stale)
        for c in charges:
            seen = self._seen.get(c.counter)
            if seen is not None and seen[1]:
                return c.counter
        return None

    async def _read(self, store: GovernanceStore, charges: list[Charge],
                    key: tuple[str, ...]) -> None:
        pending = self._reading.get(key)
        if pending is not None:  # another request is reading the same accounts
            await asyncio.shield(pending)
            return
        future: asyncio.Future[dict[str, bool]] = asyncio.get_running_loop().create_future()
        self._reading[key] = future
        try:
            held = await store.figures(charges)
            read_at = self.clock()
            if len(self._seen) > _MAX_ACCOUNTS:
                self._seen.clear()
            past = {}
            for c in charges:
                f = held[c.counter]
                past[c.counter] = c.limit is not None and f.committed + f.liability >= c.limit
                self._seen[c.counter] = (read_at, past[c.counter])
            future.set_result(past)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a waiter re-raises it, nobody else logs it
            raise
        finally:
            del self._reading[key]


def soft_names(model: ModelSettings) -> frozenset[str]:
    """The names of ``model``'s soft-tier deployments (empty: no soft tier)."""
    tier = model.routing.soft_tier if model.routing is not None else None
    return frozenset(tier.deployments) if tier is not None else frozenset()



async def choose_tier(budgets: SoftBudgets, store: GovernanceStore, model: ModelSettings,
                      charges: Sequence[Charge], *, input_tokens: int,
                      tools: bool) -> TierChoice:
    """The tier of one request of a model with a soft tier: soft once a soft budget in
    ``charges`` is spent (:meth:`SoftBudgets.past`), unless the request needs what the
    tier lacks (:func:`lacks`: then standard, saying which)."""
    tier = model.routing.soft_tier if model.routing is not None else None
    if tier is None or not charges:
        return STANDARD
    past = await budgets.past(store, charges, tier.max_age_s)
    if past is None:
        return STANDARD
    kept = lacks(model, tier, input_tokens=input_tokens, tools=tools)
    return TierChoice(tier="standard" if kept else "soft", budget=past, kept=kept)
