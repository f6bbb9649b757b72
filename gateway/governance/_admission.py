"""One admission: a request's facts in, its permit out, in a bounded number of store decisions.

The ingress hands :meth:`gateway.governance.Governor.admit` an :class:`Ask`: who (the
principal it resolved and the key's hash), what (model, request id), its
:class:`~gateway.governance.Bounds` and TPM estimate, and, when its deployment can count
input, a :class:`Refinement`. The Governor plans the counters
(:func:`~gateway.governance.build_request`) and asks its store; after a refusal it goes
on, in this order:

- **snapshot mismatch** (the key, team or policy moved since the plan): the principal is
  resolved afresh through the :class:`Keys` the Governor was given at construction and
  the request planned again, so a permit is always admitted under one snapshot. A round
  planned from a newer snapshot than the refused one is progress (publishes in quick
  succession can refuse a request several times, and each re-plan still converges);
  rounds that brought nothing newer end after ``MAX_SNAPSHOT_RETRIES``, all rounds after
  ``MAX_SNAPSHOT_ROUNDS``;
- **catch-up** (once): a refusal while this replica's own settlements of the team are in
  flight is decided again once they landed, so a sequential client is never refused what
  waiting for its previous answer's settlement would admit;
- **a tighter bound** after a money or token-quota shortfall: the input refined (a cached
  or prefix-extended count, then the provider's count: :class:`Refinement`), else budget
  fit (the largest output allowance that fits the refusing counter, when that counter
  allows fit and the allowance is at least its floor), at most ``MAX_TIGHTENINGS`` times.

So one admission makes at most ``1 + MAX_SNAPSHOT_ROUNDS + 1 + MAX_TIGHTENINGS`` = 18
store decisions (:data:`MAX_DECISIONS`); a normal request makes 1, one fitted or refined
once makes 2. A request with fallback deployments is admitted once per attempt.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from gateway.governance._bounds import Bounds
from gateway.governance._model import AdmissionRequest, Charge, Permit, Refusal, RefusalFigures
from gateway.keys import Principal
from gateway.policy import PolicySnapshot

MAX_SNAPSHOT_RETRIES = 3
"""Re-plans that brought no newer snapshot (the refresh could not clear the mismatch)
before the client gets the 503 (with Retry-After)."""
MAX_SNAPSHOT_ROUNDS = 12
"""Re-plans in all, even when each one planned from a newer snapshot: a policy published,
or a key or team edited, again while every previous round was in flight."""
MAX_TIGHTENINGS = 4
"""Tighter bounds after shortfall refusals: a cached or prefix count, the provider's
count, and budget fit for each further refusing counter (a team's day and month windows,
a policy budget)."""
MAX_DECISIONS = 1 + MAX_SNAPSHOT_ROUNDS + 1 + MAX_TIGHTENINGS
"""Store decisions one admission makes at most (module docstring)."""

_QUOTA_CODES = ("budget_exhausted", "token_quota_exhausted")


class Keys(Protocol):
    """What admission re-reads after a snapshot mismatch (the ingress's key store and
    policy source); given to the Governor at construction."""

    def snapshot(self) -> PolicySnapshot:
        """The policy snapshot to plan with now."""
        ...

    async def renew(self, refusal: Refusal, *, key_hash: str, model: str,
                    used_generation: int) -> Principal | None:
        """After a snapshot mismatch: the policy refreshed if it moved, and the key
        resolved afresh (None: no key to resolve). Raises the client's error when the key
        is no longer valid or may no longer use ``model``."""
        ...


class Refinement(Protocol):
    """The input count of one attempt (its deployment's provider), for shortfalls."""

    async def tighter(self, bounds: Bounds) -> Bounds | None:
        """``bounds`` with the input refined one step, or None when nothing changed.
        Only a lower input is tighter; new bounds with the same input say why not (a
        count that failed) or that a count was asked."""
        ...


class Ask(msgspec.Struct, frozen=True):
    """What admission is told about a request: facts, planned by the Governor."""

    request_id: str
    model: str
    principal: Principal
    bounds: Bounds
    tpm: int
    """The TPM buckets' estimate (:func:`~gateway.governance.tpm_estimate`)."""
    key_hash: str = ""
    """The presented key's SHA-256, to resolve it afresh after a snapshot mismatch."""
    refinement: Refinement | None = None


class Fit(msgspec.Struct, frozen=True):
    """Budget fit's lower output allowance, and the counter it was fitted to."""

    per_choice: int
    before: int
    """The per-choice allowance before the fit."""
    counter: str
    remaining: int
    """What the counter could still take when it refused."""


class Decided(msgspec.Struct, frozen=True):
    """How an admission ended: the principal, bounds and fit the last plan was made with,
    the permit (None: refused) and how many store decisions it took."""

    permit: Permit | None
    principal: Principal
    bounds: Bounds
    fit: Fit | None
    decisions: int


def remaining(f: RefusalFigures) -> int:
    """What the counter could still take: limit − committed − liability − reserved − leased."""
    return max(0, (f.limit or 0) - f.committed - f.liability - f.reserved - f.leased)


def largest_output(bounds: Bounds, f: RefusalFigures) -> int:
    """The largest output allowance with which the request would fit ``f`` now (-1: none)."""
    room = remaining(f)
    if f.dimension == "tokens":
        return min(bounds.output_tokens, room - bounds.input_tokens) if room >= \
            bounds.input_tokens else -1
    if bounds.usd_of(0) > room:
        return -1
    lo, hi = 0, bounds.output_tokens
    while lo < hi:  # the bound grows with the output allowance: bisect
        mid = (lo + hi + 1) // 2
        if bounds.usd_of(mid) <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


def is_shortfall(refusal: Refusal) -> bool:
    """A money or token-quota refusal with its figures: one a tighter bound may clear."""
    return refusal.code in _QUOTA_CODES and refusal.figures is not None


def fit_charge(refusal: Refusal, request: AdmissionRequest | None) -> Charge | None:
    """The refusing charge, if budget fit is allowed on it."""
    if request is None or refusal.figures is None or refusal.code not in _QUOTA_CODES:
        return None
    for charge in request.charges:
        if charge.counter == refusal.counter and charge.fit_floor is not None:
            return charge
    return None


def fit(bounds: Bounds, refusal: Refusal, request: AdmissionRequest) -> Fit | None:
    """Budget fit: the largest output allowance that fits the refusing counter, if the
    counter allows fit and that is at least its floor and below the current allowance.

    The limit is per choice: a chat request with n choices may generate n times it, so
    the allowance that fits is split between them."""
    charge = fit_charge(refusal, request)
    if charge is None or refusal.figures is None or refusal.counter is None:
        return None
    choices = bounds.choices
    per_choice = largest_output(bounds, refusal.figures) // choices
    if (per_choice < max(1, charge.fit_floor or 0)
            or per_choice * choices >= bounds.output_tokens):
        return None
    return Fit(per_choice=per_choice, before=bounds.output_tokens // choices,
               counter=refusal.counter, remaining=remaining(refusal.figures))
