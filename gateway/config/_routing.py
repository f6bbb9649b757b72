"""How a model's requests are spread over its deployments (``models[].routing``).

Absent, a model's deployments are tried in their listed order, as before: the first one
until it fails, then the next. With ``routing:`` the gateway balances (``strategy``), keeps
each deployment's health from what it sees (errors, timeouts, ``retry-after``: a cooldown
and a circuit breaker) and, with ``affinity``, pins a session to the deployment whose
prompt cache it warmed (docs/routing.md).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gateway.ceilings import MAX_AMOUNT
from gateway.config._ranges import PRICE_FIELDS, Seconds, SecondsOrZero
from gateway.pricing import ModelPrice

Strategy = Literal["ordered", "weighted", "least_busy"]
AffinityConflict = Literal["preferAffinity", "preferFallback"]
Weight = Annotated[int, msgspec.Meta(ge=0, le=1000)]
InFlight = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
TrackedSessions = Annotated[int, msgspec.Meta(ge=1, le=10_000_000)]
Waiters = Annotated[int, msgspec.Meta(ge=1, le=1000)]


class RoutingSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``models[].routing``: balancing, health and cache affinity for one model."""

    strategy: Strategy = "weighted"
    """``weighted``: smooth weighted round robin over the healthy deployments with room
    (equal weights: round robin); ``least_busy``: fewest requests in flight per unit of
    weight; ``ordered``: the listed order, skipping unhealthy or full ones."""
    cooldown_s: Seconds = 30.0
    """How long a deployment is left out after a failure (a 429/5xx, a connect error, a
    timeout); doubled for each further failure in a row, at most ``max_cooldown_s``, and
    at least the upstream's ``retry-after``. After it one probe request is let through
    (half-open); its success closes the circuit."""
    max_cooldown_s: Seconds = 300.0
    affinity: bool = False
    """Pin a session (the agent's session header, OpenAI's ``prompt_cache_key``, else the
    hash of the cacheable prefix) to the deployment that served it, for the cache TTL."""
    on_affinity_conflict: AffinityConflict | None = None
    """What wins when the pinned deployment is full or briefly cooling down (ADR-031:
    neither by default, so required with ``affinity``): ``preferAffinity`` waits up to
    ``affinity_wait_s`` for it; ``preferFallback`` moves at once and pays the cache write.
    A deployment whose circuit is open is never waited for."""
    affinity_wait_s: SecondsOrZero = 5.0
    affinity_sessions: TrackedSessions = 100_000
    """Sessions remembered at most per replica (the oldest pin goes first)."""
    dedupe: bool = False
    """Identical concurrent non-streamed requests of one team (same endpoint and body)
    make one upstream call; the others wait for its answer, admitted and settled at zero
    cost (``gateway/routing/_dedupe.py``)."""
    dedupe_waiters: Waiters = 16
    """Requests that may wait for one identical request at most (the rest go upstream)."""

    def __post_init__(self) -> None:
        if self.affinity and self.on_affinity_conflict is None:
            raise ValueError("on_affinity_conflict: required when affinity is on "
                             "(preferAffinity or preferFallback; ADR-031)")
        if self.max_cooldown_s < self.cooldown_s:
            raise ValueError("max_cooldown_s: must be at least cooldown_s")


def check_deployment_price(price: ModelPrice | None) -> None:
    """A deployment's own prices within the money ceiling (``models[].price`` is checked
    by ``_load``); raised as a decoding error naming the deployment."""
    if price is None:
        return
    for cls in PRICE_FIELDS:
        value = price.per_class(cls)
        if not 0 <= value <= MAX_AMOUNT:
            raise ValueError(f"price.{cls}: must be an integer in 0..{MAX_AMOUNT} "
                             f"(µUSD per million tokens), got {value}")
