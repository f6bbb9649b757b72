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
the last answer; otherwise it stays the 402 it is, with the lease's figures. A
``lease_exhausted`` or ``lease_missing`` refusal is not the last word while the
heartbeat works: the store waits for the answer to the early heartbeat it asked for
(one round trip, :meth:`LeaseState.next_answer`) and decides the request once more.

**Sizing and release** (issue 25). Each heartbeat asks, per account, for ``want`` = the
µUSD its admissions reserved over the last renew interval (at least the charge it
refused), so grants follow the request bounds the plane sees. It *releases* what it
holds but does not need — an account without an admission in the last renew interval,
or one whose headroom did not fit a charge (``need``) — by freezing the lease
(nothing more is admitted on it until the answer) before it reads its figures, and
reporting ``cap`` = held + what admissions planned before the freeze may still add
(:attr:`LeaseState.inflight`): the ledger lowers the allowance to the cap, so the
unused allowance is back in the pool within one heartbeat, for any plane or shared
gateway, and grants exactly ``want`` (nothing below ``need``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
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
    frozen: bool = False
    """Released by the heartbeat in flight: nothing is admitted on it until the answer."""
    reserve: int = 0
    """µUSD of admissions planned before the release this lease answers and undecided
    when it arrived: they were checked against the older allowance, so new admissions
    leave room for them (the ledger's allowance counts them through the cap)."""

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

    @property
    def spare(self) -> int:
        """Headroom left at the most (what was admitted counts in full)."""
        return max(0, self.allowance - self.held - self.admitted)


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
        self.inflight: dict[str, int] = {}
        """µUSD of admissions planned on each leased account and not decided yet (they
        may still be admitted under the clamp they were planned with)."""
        self.recent: dict[str, deque[tuple[float, int]]] = {}
        """(time, µUSD) of each admission per account within the last renew interval."""
        self.healthy = True
        """The last heartbeat was answered (a request waits for the next one only then)."""
        self.answer_wait_s = 5.0
        """How long a request waits for the answer to the heartbeat it asked for."""
        self._begun = 0
        self._ended = 0
        self._answered = asyncio.Event()

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
            if lease.frozen:  # being released: decided again with the answer
                if rule.fail_open and not self.healthy:
                    return charge  # no answer coming: its own limit, as when expired
                # Asked for in the next heartbeat too, should this answer not cover it.
                self._ask(charge.counter, rule.uid, charge.amount)
                return refuse("lease_exhausted", lease.key, retry_after=1,
                               lease=LeaseFacts(allowance=lease.allowance,
                                                remaining=lease.remaining))
            allowance = lease.allowance - lease.reserve
            if charge.limit is not None and allowance >= charge.limit:
                return charge
            return msgspec.structs.replace(charge, limit=max(0, allowance))
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
        valid = lease.open and lease.expires > self.clock()
        if valid and lease.remaining >= amount:
            self._ask(lease.key, lease.rule_uid, amount)
            return refuse("lease_exhausted", lease.key, retry_after=1,
                           lease=LeaseFacts(allowance=lease.allowance,
                                            remaining=lease.remaining))
        if valid and lease.spare > 0:
            # Headroom too small for this charge: released by the next heartbeat, for a
            # plane or shared gateway whose own headroom it completes.
            self._ask(lease.key, lease.rule_uid, amount)
        figures = (f" (this data plane's lease allowance {lease.allowance} µUSD; the "
                   f"budget had {lease.remaining} µUSD left across all data planes at the "
                   "last heartbeat)")
        return msgspec.structs.replace(refusal, reason=refusal.reason + figures)

    def admitted(self, permit: Permit) -> None:
        """Count an admission against its leases; renew early below half a grant."""
        now = self.clock()
        for charge in permit.request.charges:
            lease = self.leases.get(charge.counter) if charge.kind == "account" else None
            if lease is not None:
                lease.admitted += charge.amount
                self.recent.setdefault(lease.key, deque()).append((now, charge.amount))
                if lease.low:
                    self.wake.set()

    def hold(self, req: AdmissionRequest) -> list[tuple[str, int]]:
        """Count a planned admission's leased charges as in flight until :meth:`unhold`."""
        held = [(c.counter, c.amount) for c in req.charges
                if c.kind == "account" and c.counter in self.leases]
        for key, amount in held:
            self.inflight[key] = self.inflight.get(key, 0) + amount
        return held

    def unhold(self, held: list[tuple[str, int]]) -> None:
        for key, amount in held:
            left = self.inflight.get(key, 0) - amount
            if left > 0:
                self.inflight[key] = left
            else:
                self.inflight.pop(key, None)

    def waits(self, decided: Permit | Refusal) -> bool:
        """Whether a refusal is decided again once the early heartbeat it asked for is
        answered (the heartbeat works, and the refusal is a lease's, not the budget's)."""
        return (isinstance(decided, Refusal) and self.healthy
                and decided.code in ("lease_exhausted", "lease_missing"))

    def answer_target(self, req: AdmissionRequest) -> int:
        """The heartbeat whose answer decides ``req`` again: the one in flight when it
        froze one of ``req``'s leases (it carries what was asked before the freeze), else
        the next one to begin (it carries what ``req`` asked)."""
        frozen = any(lease.frozen for c in req.charges
                     if (lease := self.leases.get(c.counter)) is not None)
        return self._begun if frozen else self._begun + 1

    def ask_answer(self) -> int:
        """Ask for an early heartbeat; the number of the one whose answer follows."""
        self.wake.set()
        return self._begun + 1

    async def next_answer(self, target: int) -> bool:
        """Wait (at most :attr:`answer_wait_s`) until heartbeat number ``target`` has
        ended; whether it has."""
        deadline = time.monotonic() + self.answer_wait_s
        while self._ended < target:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._answered.wait(), left)
            except TimeoutError:
                return False
        return True

    # -- the heartbeat -----------------------------------------------------------------

    def take_demand(self) -> dict[str, tuple[str, int]]:
        demand, self.demand = self.demand, {}
        return demand

    def beat_begun(self) -> None:
        """A heartbeat's request is being built (what was asked before is in it)."""
        self._begun += 1

    def beat_ended(self, *, answered: bool) -> None:
        """Every heartbeat begun so far has ended (they run one at a time)."""
        self._ended = self._begun
        self.healthy = answered
        self._answered.set()
        self._answered = asyncio.Event()

    def want(self, key: str, need: int) -> int:
        """µUSD to ask for beyond what the account holds: what admissions reserved on it
        over the last renew interval, at least ``need``."""
        recent = self.recent.get(key)
        horizon = self.clock() - self.heartbeat_ms / 1000
        while recent and recent[0][0] < horizon:
            recent.popleft()
        if recent is not None and not recent:
            del self.recent[key]
        return max(need, sum(a for _, a in recent) if recent else 0)

    def release(self, demand: dict[str, tuple[str, int]]) -> dict[str, int]:
        """Freeze the leases to release now: without an admission in the last renew
        interval (idle: its headroom goes back, and it is granted nothing while it stays
        idle), or asked for a charge (``demand``) their headroom did not fit. Called
        before the figures are read; returns, per frozen account, the µUSD that
        admissions planned before the freeze may still add."""
        now = self.clock()
        out = {}
        for key, lease in self.leases.items():
            if lease.expires <= now or not lease.open:
                continue
            short = demand.get(key, ("", 0))[1] > 0
            if short or self.want(key, 0) == 0:
                lease.frozen = True
                out[key] = self.inflight.get(key, 0)
        return out

    def renewed(self, grants: list[LeaseGrant], *, sent: float, heartbeat_ms: int) -> None:
        """Install a heartbeat's leases (replacing the whole table in one assignment)."""
        leases = {g.key: Lease.from_grant(g, sent=sent) for g in grants}
        for key, lease in leases.items():
            previous = self.leases.get(key)
            if previous is not None and previous.frozen:
                lease.reserve = self.inflight.get(key, 0)
        self.leases = leases
        self.heartbeat_ms = heartbeat_ms
        self.last_success = sent

    def managed_rules(self) -> dict[str, ManagedRule]:
        return self.applied.managed
