"""Which deployment a request tries first, and which next: balancing, health, affinity.

:meth:`Router.plan` orders a model's candidate deployments (those that speak the request's
protocol) for one request: the usable ones (circuit closed or half-open with no probe in
flight, below ``max_inflight``) in the strategy's order, then the full ones, then the
cooling ones (soonest back first) — a last resort, so a request is refused only when every
deployment failed it. Affinity then only moves the session's pinned deployment to the
front *among the usable ones*: it never brings back one the balancer left out. When the
pinned one is full or briefly cooling down (one failure, back within
``affinity_wait_s``), ``preferAffinity`` waits for it (:meth:`Plan.settle_affinity`) and
``preferFallback`` moves on and pays the cache write.

The ingress reports what it saw (:meth:`Router.sent`, :meth:`Router.left`,
:meth:`Router.succeeded`, :meth:`Router.failed`) and pins the session to the deployment
whose answer reached the client (:meth:`Plan.served`). A model without ``routing`` keeps
the listed order and none of this state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gateway.config import Deployment, ModelSettings, deployment_names
from gateway.routing._dedupe import Dedupe
from gateway.routing._health import Health, State, exhausted_s
from gateway.routing._pins import SharedPins
from gateway.routing._session import Session
from gateway.routing._soft import STANDARD, SoftBudgets, TierChoice, soft_names

log = logging.getLogger("mayu.routing")

P = TypeVar("P")


@dataclass
class _Model:
    """One routed model's state on this replica."""

    names: dict[int, str]
    index: dict[int, int]
    """id(deployment) → its index in ``models[].deployments``."""
    health: dict[str, Health] = field(default_factory=dict)
    current: dict[str, int] = field(default_factory=dict)
    """Smooth weighted round robin's running weights."""
    pins: OrderedDict[str, tuple[str, float]] = field(default_factory=OrderedDict)
    """Session key → (deployment name, expiry), oldest first."""


@dataclass
class Plan(Generic[P]):
    """One request's route: the deployments to try, in order."""

    router: Router
    model: ModelSettings
    order: list[tuple[Deployment, P]]
    session: Session | None = None
    pinned: str | None = None
    """The session's pinned deployment, if any (whether or not it is first)."""
    wait_for: str | None = None
    """``preferAffinity``: the pinned deployment to wait for before the first attempt."""
    tier: TierChoice = STANDARD
    """The tier chosen (``routing.soft_tier``): soft puts the soft-tier deployments
    first and keeps the others as their fallbacks; standard leaves them out."""

    def tier_of(self, deployment: Deployment) -> str | None:
        """What the usage log and the answer say served: ``soft`` or ``standard`` for a
        model with a soft tier, None for one without."""
        soft = soft_names(self.model)
        if not soft:
            return None
        return "soft" if self.router.name_of(self.model, deployment) in soft else "standard"

    async def settle_affinity(self) -> None:
        """``preferAffinity``: wait up to ``affinity_wait_s`` for the pinned deployment to
        have room or end its cooldown, then put it first; otherwise go on without it."""
        if self.wait_for is None:
            return
        routing = self.model.routing
        assert routing is not None
        deadline = self.router.clock() + routing.affinity_wait_s
        ready = await self.router.wait_usable(self.model, self.wait_for, deadline)
        pos = next(i for i, (d, _) in enumerate(self.order)
                   if self.router.name_of(self.model, d) == self.wait_for)
        if ready:
            self.order.insert(0, self.order.pop(pos))
            self.router.note("affinity_waited")
        else:
            self.router.note("affinity_moved")

    def served(self, deployment: Deployment) -> None:
        """The answer from ``deployment`` reached the client: pin the session to it."""
        if self.session is not None and self.model.routing is not None \
                and self.model.routing.affinity:
            self.router.pin(self.model, self.session, deployment)


class Router:
    """Routing state for every routed model of this replica (in memory)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._models: dict[str, _Model] = {}
        self.decisions: dict[str, int] = {}
        """How often each kind of affinity decision was taken (tests, metrics)."""
        self.dedupe = Dedupe()
        """Identical requests in flight (``routing.dedupe``)."""
        self.shared: SharedPins | None = None
        """The shared profile's pins (:meth:`share`); None: this replica's memory only."""
        self.soft = SoftBudgets(clock=clock)
        """Soft budget figures, read at most every ``soft_tier.max_age_s``."""

    def share(self, pool: Any) -> None:
        """Keep pins in the shared database too (the shared profile's pool)."""
        self.shared = SharedPins(pool)

    async def recall(self, model: ModelSettings, session: Session | None) -> None:
        """Before :meth:`plan`: a session this replica holds no live pin for takes the
        shared database's (another replica served it), if any."""
        if session is None or self.shared is None or model.routing is None \
                or not model.routing.affinity:
            return
        if self.pinned(model, session, self.clock()) is not None:
            return
        row = await self.shared.get(model.name, session.lookup)
        if row is not None:
            st = self._state(model)
            st.pins[session.pin] = (row[0], self.clock() + row[1])
            self.note("affinity_recalled")

    def note(self, decision: str) -> None:
        self.decisions[decision] = self.decisions.get(decision, 0) + 1

    def _state(self, model: ModelSettings) -> _Model:
        st = self._models.get(model.name)
        if st is None:
            st = self._models[model.name] = _Model(
                names=deployment_names(model),
                index={id(d): i for i, d in enumerate(model.deployments)})
        return st

    def name_of(self, model: ModelSettings, deployment: Deployment) -> str:
        st = self._state(model)
        i = st.index.get(id(deployment))
        if i is None and any(d is deployment for d in model.deployments):
            # A model overlaid by a RoutingPolicy (gateway.policy.routed_model, which keeps
            # it alive, so its ids stay its own): index its deployments by position too.
            st.index.update({id(d): j for j, d in enumerate(model.deployments)})
            i = st.index[id(deployment)]
        if i is None:  # an equal value built elsewhere (tests)
            i = model.deployments.index(deployment)
        return st.names[i]

    def _health(self, model: ModelSettings, name: str) -> Health:
        st = self._state(model)
        h = st.health.get(name)
        if h is None:
            h = st.health[name] = Health()
        return h

    def plan(self, model: ModelSettings, candidates: Sequence[tuple[Deployment, P]], *,
             session: Session | None = None, tier: TierChoice = STANDARD) -> Plan[P]:
        """The order to try ``candidates`` in for one request (module docstring). With a
        soft tier: on ``tier`` soft its deployments first (affinity among them), the
        others after them as fallbacks; on standard the soft-tier ones are left out."""
        routing = model.routing
        if routing is None:
            return Plan(self, model, list(candidates))
        soft = soft_names(model)
        if soft:
            ours = [c for c in candidates if self.name_of(model, c[0]) in soft]
            rest = [c for c in candidates if self.name_of(model, c[0]) not in soft]
            if tier.tier == "soft" and ours:
                plan = self._plan(model, ours, session)
                plan.order += self._plan(model, rest, None).order
                plan.tier = tier
                return plan
            candidates = rest
        plan = self._plan(model, candidates, session)
        plan.tier = tier  # standard, perhaps kept there for a capability (TierChoice.kept)
        return plan

    def _plan(self, model: ModelSettings, candidates: Sequence[tuple[Deployment, P]],
              session: Session | None) -> Plan[P]:
        routing = model.routing
        assert routing is not None
        now = self.clock()
        groups: dict[State, list[tuple[Deployment, P]]] = {s: [] for s in State}
        states: dict[str, State] = {}
        for d, p in candidates:
            name = self.name_of(model, d)
            states[name] = state = self._health(model, name).state(now, d.max_inflight)
            groups[state].append((d, p))
        usable = self._balance(model, groups[State.USABLE], routing.strategy)
        cooling = sorted(groups[State.COOLING],
                         key=lambda c: self._health(model, self.name_of(model, c[0])).until)
        plan = Plan(self, model, usable + groups[State.FULL] + cooling, session=session)
        if routing.affinity and session is not None:
            self._apply_affinity(plan, states, now)
        return plan

    def _balance(self, model: ModelSettings, usable: list[tuple[Deployment, P]],
                 strategy: str) -> list[tuple[Deployment, P]]:
        if len(usable) < 2 or strategy == "ordered":
            return usable
        if strategy == "least_busy":
            return sorted(usable, key=lambda c: (
                self._health(model, self.name_of(model, c[0])).inflight / max(c[0].weight, 1)
                + (0 if c[0].weight else 1e9)))
        # Smooth weighted round robin (nginx): each pick is the largest running weight.
        st = self._state(model)
        total = 0
        best: tuple[Deployment, P] | None = None
        for c in usable:
            name = self.name_of(model, c[0])
            st.current[name] = st.current.get(name, 0) + c[0].weight
            total += c[0].weight
            if c[0].weight and (best is None or
                                st.current[name] > st.current[self.name_of(model, best[0])]):
                best = c
        if best is None:  # every usable deployment has weight 0: listed order
            return usable
        st.current[self.name_of(model, best[0])] -= total
        rest = [c for c in usable if c is not best]
        rest.sort(key=lambda c: c[0].weight == 0)
        return [best, *rest]

    def _apply_affinity(self, plan: Plan[P], states: dict[str, State], now: float) -> None:
        routing = plan.model.routing
        assert routing is not None and plan.session is not None
        pinned = self.pinned(plan.model, plan.session, now)
        if pinned is None or pinned not in states:
            self.note("affinity_none")
            return
        plan.pinned = pinned
        pos = next(i for i, (d, _) in enumerate(plan.order)
                   if self.name_of(plan.model, d) == pinned)
        state = states[pinned]
        if state is State.USABLE:
            plan.order.insert(0, plan.order.pop(pos))
            self.note("affinity_kept")
            return
        h = self._health(plan.model, pinned)
        brief = state is State.FULL or (
            h.failures == 1 and h.until - now <= routing.affinity_wait_s)
        if brief and routing.on_affinity_conflict == "preferAffinity" \
                and routing.affinity_wait_s > 0:
            plan.wait_for = pinned
        else:
            self.note("affinity_moved")

    def pinned(self, model: ModelSettings, session: Session, now: float) -> str | None:
        st = self._state(model)
        for key in session.lookup:
            hit = st.pins.get(key)
            if hit is not None and hit[1] > now:
                return hit[0]
        return None

    def pin(self, model: ModelSettings, session: Session, deployment: Deployment) -> None:
        st = self._state(model)
        routing = model.routing
        assert routing is not None
        name, now = self.name_of(model, deployment), self.clock()
        before = st.pins.get(session.pin)
        st.pins[session.pin] = (name, now + session.ttl_s)
        st.pins.move_to_end(session.pin)
        if self.shared is not None and (before is None or before[0] != name
                                        or before[1] - now < session.ttl_s / 2):
            self.shared.put(model.name, session.pin, name, session.ttl_s)
        while len(st.pins) > routing.affinity_sessions:
            st.pins.popitem(last=False)

    async def wait_usable(self, model: ModelSettings, name: str, deadline: float) -> bool:
        """Wait until ``name`` is usable or ``deadline`` passes; whether it is."""
        d = model.deployments[next(i for i, n in self._state(model).names.items() if n == name)]
        h = self._health(model, name)
        while True:
            now = self.clock()
            if h.state(now, d.max_inflight) is State.USABLE:
                return True
            if now >= deadline:
                return False
            wake = min(deadline, h.until) if h.until > now else deadline
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(h.freed.wait(), timeout=max(0.001, wake - now))

    # What the ingress saw; each a no-op for a model without routing.

    def sent(self, model: ModelSettings, deployment: Deployment) -> None:
        if model.routing is not None:
            self._health(model, self.name_of(model, deployment)).enter(self.clock())

    def left(self, model: ModelSettings, deployment: Deployment) -> None:
        if model.routing is not None:
            self._health(model, self.name_of(model, deployment)).leave()

    def succeeded(self, model: ModelSettings, deployment: Deployment, *,
                  ratelimit: dict[str, str] | None = None) -> None:
        """An answer (not a failure); ``ratelimit``: its rate-limit headers, which may
        say the deployment is out of headroom until a reset (:func:`exhausted_s`)."""
        routing = model.routing
        if routing is None:
            return
        name = self.name_of(model, deployment)
        h = self._health(model, name)
        h.succeeded()
        pause = exhausted_s(ratelimit) if ratelimit else None
        if pause is None and ratelimit:
            h.exhausted_until = 0.0  # it reports headroom again
        elif pause is not None:
            pause = min(pause, routing.max_cooldown_s)
            h.exhausted_until = max(h.exhausted_until, self.clock() + pause)
            self.note("ratelimit_exhausted")
            log.info("routing: deployment %s of model %s has no rate-limit headroom for "
                     "%.1f s (its answer's headers)", name, model.name, pause)

    def failed(self, model: ModelSettings, deployment: Deployment, *,
               retry_after_s: float | None, why: str) -> None:
        routing = model.routing
        if routing is None:
            return
        name = self.name_of(model, deployment)
        pause = self._health(model, name).failed(
            self.clock(), cooldown_s=routing.cooldown_s, max_cooldown_s=routing.max_cooldown_s,
            retry_after_s=retry_after_s)
        log.warning("routing: deployment %s of model %s left out for %.1f s (%s)",
                    name, model.name, pause, why)

    def snapshot(self, model: ModelSettings) -> dict[str, dict[str, float]]:
        """Each deployment's health figures (for tests and the admin view)."""
        now = self.clock()
        return {name: {"failures": h.failures, "cooling_s": max(0.0, h.until - now),
                       "inflight": h.inflight,
                       "exhausted_s": max(0.0, h.exhausted_until - now)}
                for name, h in self._state(model).health.items()}
