"""How a model's requests are spread over its deployments (``models[].routing``).

Absent, a model's deployments are tried in their listed order, as before: the first one
until it fails, then the next. With ``routing:`` the gateway balances (``strategy``), keeps
each deployment's health from what it sees (errors, timeouts, ``retry-after``: a cooldown
and a circuit breaker) and, with ``affinity``, pins a session to the deployment whose
prompt cache it warmed (docs/routing.md). ``soft_tier`` names the cheaper deployments that
serve a caller once a soft budget of theirs is spent (ADR-046).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from gateway.ceilings import MAX_AMOUNT
from gateway.config._ranges import PRICE_FIELDS, Seconds, SecondsOrZero
from gateway.pricing import ModelPrice

if TYPE_CHECKING:  # _settings builds on this module
    from gateway.config._settings import ModelSettings

Strategy = Literal["ordered", "weighted", "least_busy"]
AffinityConflict = Literal["preferAffinity", "preferFallback"]
Weight = Annotated[int, msgspec.Meta(ge=0, le=1000)]
InFlight = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]
TrackedSessions = Annotated[int, msgspec.Meta(ge=1, le=10_000_000)]
Waiters = Annotated[int, msgspec.Meta(ge=1, le=1000)]
ContextWindow = Annotated[int, msgspec.Meta(ge=1, le=100_000_000)]
MaxAge = Annotated[float, msgspec.Meta(ge=0, le=60)]


class SoftTier(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``models[].routing.soft_tier``: where a caller past a soft budget is served.

    A soft budget is a GovernancePolicy ``budget`` rule with ``hardCap: false`` (team,
    user or team-user subject). Once one that binds the caller holds committed +
    liability at or above its limit (reserved amounts alone never count), its requests
    go to these deployments instead of the others; the others stay their fallbacks. The
    deployments listed here serve nobody else."""

    deployments: list[str]
    """Names of this model's deployments (``deployments[].name``, else
    ``provider/upstream_model``); each needs its own ``price``."""
    max_input_tokens: ContextWindow | None = None
    """The tier's context window; unset: its first deployment's upstream model's figure
    in the built-in catalog (none there: no limit known). A request whose input bound is
    above it keeps its usual deployments."""
    tools: bool = True
    """Whether the tier serves requests that declare tools (false: they keep theirs)."""
    max_age_s: MaxAge = 0.25
    """How old the read of a soft budget's figures may be (cached per budget and
    replica): a switch lags the spend by at most this, plus the settlements in flight."""


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
    soft_tier: SoftTier | None = None
    """The cheaper deployments serving a caller past a soft budget (:class:`SoftTier`)."""

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


def deployment_names(model: ModelSettings) -> dict[int, str]:
    """Each deployment's name (by its index): ``name``, else ``provider/upstream_model``,
    with ``#n`` added to a repeated one."""
    names: dict[int, str] = {}
    seen: set[str] = set()
    for i, d in enumerate(model.deployments):
        base = d.name or f"{d.provider}/{d.upstream_model or model.name}"
        name, n = base, 1
        while name in seen:
            n += 1
            name = f"{base}#{n}"
        seen.add(name)
        names[i] = name
    return names


def check_soft_tier(where: str, model: ModelSettings) -> str | None:
    """What is wrong with ``model``'s ``routing.soft_tier`` (None: nothing): every name
    one of its deployments, each with its own price (the tier is cheaper: settling it at
    the model's price would charge the dearer tier's figures), and at least one
    deployment left outside the tier."""
    tier = model.routing.soft_tier if model.routing is not None else None
    if tier is None:
        return None
    names = deployment_names(model)
    by_name = {n: model.deployments[i] for i, n in names.items()}
    if not tier.deployments:
        return f"{where}.routing.soft_tier.deployments: name at least one deployment"
    for name in tier.deployments:
        d = by_name.get(name)
        if d is None:
            return (f"{where}.routing.soft_tier.deployments: {name!r} is not one of the "
                    f"model's deployments ({', '.join(by_name)})")
        if d.price is None:
            return (f"{where}.routing.soft_tier.deployments: {name!r} needs its own "
                    "price (the cheaper tier is settled at it)")
    if len(set(tier.deployments)) == len(names):
        return (f"{where}.routing.soft_tier.deployments: every deployment is in the soft "
                "tier; leave the usual ones out of it")
    return None
