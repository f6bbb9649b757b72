"""What a lease-profile plane holds between heartbeats, and clamp-and-gate (ADR-034 §3).

:class:`LeaseState` is read by the request path and written by the heartbeat, both on
the event loop, so no lock is needed; each heartbeat replaces the lease table in one
assignment. The request path never waits on the control plane: :meth:`LeaseState.plan`
is dictionary lookups and a clock read.

For every charge on a lease-managed account (a budget rule of the applied set, for one
scope and window):

- **gate**: a rejected FailClosed rule refuses (503 ``rule_unsupported``);
- **clamp**: within a valid lease, a hard cap's limit becomes ``min(limit, allowance)``,
  so the local store's own exact check keeps committed + liability + reserved within
  the allowance (no overshoot: reservations are sound bounds);
- **expired or missing lease** (3 renew intervals without an answer, or never granted):
  a FailClosed hard cap refuses (503 ``lease_expired`` / ``lease_missing``) while a
  FailOpen rule falls back to its own limit on local counters and keeps serving; soft
  caps never refuse.

A local refusal on a leased account becomes 503 ``lease_exhausted`` (and an early
heartbeat asking for at least that charge) when the budget still had room for it at
the last answer; otherwise it stays the 402 it is, with the lease's figures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from gateway.governance import (
    AdmissionRequest,
    Charge,
    CounterKey,
    LeaseFacts,
    Permit,
    Refusal,
)
from gateway.governance import refusal as refuse  # `refusal` names a parameter below
from gateway.lease._apply import EMPTY_APPLIED, AppliedPolicy, ManagedRule
from gateway.lease._wire import DEFAULT_HEARTBEAT_MS, EXPIRY_RENEWALS, LeaseGrant


@dataclass
class Lease:
    """One account's lease as the plane enforces it."""

    key: str
    rule_uid: str
    allowance: int
    expires: float
    """Monotonic time: the heartbeat's send time + 3 renew intervals."""
    held: int = 0
    """committed + liability + reserved as reported in the heartbeat that got it."""
    grant: int = 0
    remaining: int = 0
    limit: int | None = None
    open: bool = True
    admitted: int = 0
    """µUSD admitted on it since (an over-estimate: settlements release; it only decides
    when to renew early)."""

    @classmethod
    def from_grant(cls, g: LeaseGrant, *, sent: float) -> Lease:
        return cls(key=g.key, rule_uid=g.rule_uid, allowance=g.allowance,
                   expires=sent + EXPIRY_RENEWALS * g.renew_ms / 1000,
                   held=g.committed + g.liability + g.reserved, grant=g.grant,
                   remaining=g.remaining, limit=g.limit, open=g.open)

    @property
    def low(self) -> bool:
        """Less than half a grant of headroom left: time to renew."""
        return self.open and self.held + self.admitted > self.allowance - self.grant // 2


class LeaseState:
    """The applied policy set, the lease table and what the next heartbeat should ask."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.applied: AppliedPolicy = EMPTY_APPLIED
        self.leases: dict[str, Lease] = {}
        self.demand: dict[str, tuple[str, int]] = {}
        """Accounts a request needed: key -> (rule uid, largest charge refused)."""
        self.heartbeat_ms = DEFAULT_HEARTBEAT_MS
        self.last_success: float | None = None
        self.wake = asyncio.Event()
        """Set to ask the heartbeat loop for an early heartbeat."""

    # -- the request path ------------------------------------------------------------

    def plan(self, req: AdmissionRequest) -> AdmissionRequest | Refusal:
        """``req`` with lease-managed hard caps clamped, or the refusal that gates it."""
        applied = self.applied
        if req.policy_generation != applied.snapshot.generation:
            # Planned from a snapshot replaced meanwhile: re-plan (the ingress retries).
            return Refusal(status=503, code="snapshot_mismatch",
                           counter=CounterKey.policy().text,
                           retry_after=1, reason="policy: changed since the request was "
                           "routed (snapshot mismatch); retry")
        charges: list[Charge] | None = None
        now = self.clock()
        for i, charge in enumerate(req.charges):
            rule = applied.managed.get(charge.rule_uid or "") if charge.kind == "account" else None
            if rule is None:
                continue
            decided = self._decide(rule, charge, now)
            if isinstance(decided, Refusal):
                return decided
            if decided is not charge:
                charges = charges or list(req.charges)
                charges[i] = decided
        return req if charges is None else msgspec.structs.replace(req, charges=tuple(charges))

    def _decide(self, rule: ManagedRule, charge: Charge, now: float) -> Charge | Refusal:
        if rule.gate is not None:
            return refuse("rule_unsupported", charge.counter, retry_after=60,
                           lease=LeaseFacts(gate=rule.gate))
        if not (rule.hard and charge.hard):
            return charge  # soft caps never refuse, so never gate
        lease = self.leases.get(charge.counter)
        if lease is not None and lease.expires > now:
            if charge.limit is not None and lease.allowance >= charge.limit:
                return charge
            return msgspec.structs.replace(charge, limit=lease.allowance)
        if rule.fail_open:
            return charge  # authority gone: its own limit on local counters, no gate
        self._ask(charge.counter, rule.uid, charge.amount)
        last = self.last_success
        expiry_s = EXPIRY_RENEWALS * self.heartbeat_ms / 1000
        if lease is not None or (last is not None and now - last > expiry_s):
            return refuse("lease_expired", charge.counter,
                           retry_after=max(1, self.heartbeat_ms // 1000),
                           lease=LeaseFacts(renewals=EXPIRY_RENEWALS))
        return refuse("lease_missing", charge.counter, retry_after=1,
                       lease=LeaseFacts(started=last is not None))

    def _ask(self, key: str, rule_uid: str, amount: int) -> None:
        _, want = self.demand.get(key, (rule_uid, 0))
        self.demand[key] = (rule_uid, max(want, amount))
        self.wake.set()

    def refused(self, req: AdmissionRequest, refusal: Refusal) -> Refusal:
        """A local refusal on a leased account, made to say what the lease says."""
        lease = self.leases.get(refusal.counter or "")
        if lease is None or refusal.status != 402 or refusal.code not in (
                None, "budget_exhausted"):
            return refusal
        amount = next((c.amount for c in req.charges if c.counter == lease.key), 0)
        if lease.open and lease.remaining >= amount and lease.expires > self.clock():
            self._ask(lease.key, lease.rule_uid, amount)
            return refuse("lease_exhausted", lease.key, retry_after=1,
                           lease=LeaseFacts(allowance=lease.allowance,
                                            remaining=lease.remaining))
        figures = (f" (this data plane's lease allowance {lease.allowance} µUSD; the "
                   f"budget had {lease.remaining} µUSD left across all data planes at the "
                   "last heartbeat)")
        return msgspec.structs.replace(refusal, reason=refusal.reason + figures)

    def admitted(self, permit: Permit) -> None:
        """Count an admission against its leases; renew early below half a grant."""
        for charge in permit.request.charges:
            lease = self.leases.get(charge.counter) if charge.kind == "account" else None
            if lease is not None:
                lease.admitted += charge.amount
                if lease.low:
                    self.wake.set()

    # -- the heartbeat -----------------------------------------------------------------

    def take_demand(self) -> dict[str, tuple[str, int]]:
        demand, self.demand = self.demand, {}
        return demand

    def renewed(self, grants: list[LeaseGrant], *, sent: float, heartbeat_ms: int) -> None:
        """Install a heartbeat's leases (replacing the whole table in one assignment)."""
        self.leases = {g.key: Lease.from_grant(g, sent=sent) for g in grants}
        self.heartbeat_ms = heartbeat_ms
        self.last_success = sent

    def managed_rules(self) -> dict[str, ManagedRule]:
        return self.applied.managed
