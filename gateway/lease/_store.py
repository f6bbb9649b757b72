"""The lease profile's governance store: the local store, bounded by leases.

Counters, permits and settlements are the local profile's, exact and persisted in the
plane's own SQLite file (:class:`gateway.governance.LocalGovernanceStore`); only
admission differs. Each request first passes :meth:`gateway.lease.LeaseState.plan`
(clamp and gate, in memory), then the local store's own all-or-none transaction, whose
hard-limit check then holds every lease-managed account within its allowance. Nothing on
this path talks to the control plane; a request refused for want of a lease (missing,
used up while the budget has room, being released) waits for the answer to the early
heartbeat it asked for — one round trip, bounded; two when it met a lease being
released — and is decided once more.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import msgspec

from gateway.governance import (
    AdmissionRequest,
    Charge,
    LeaseFigures,
    LocalGovernanceStore,
    Permit,
    Refusal,
    StoredFigures,
)
from gateway.lease._state import LeaseState

_ROUNDS = 2
"""Heartbeat answers a refused request waits for at most (each bounded by
``LeaseState.answer_wait_s``)."""


class LeaseGovernanceStore(LocalGovernanceStore):
    """A :class:`LocalGovernanceStore` whose admissions are clamped and gated by leases."""

    def __init__(self, path: str, *, state: LeaseState,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 max_batch: int = 64) -> None:
        super().__init__(path, clock=clock, max_batch=max_batch)
        self.state = state

    async def figures(self, charges: list[Charge]) -> dict[str, StoredFigures]:
        """The plane's own figures, and for each leased account its lease and the
        budget's global limit and remaining as of the last answered heartbeat."""
        out = await super().figures(charges)
        leases, sent = self.state.leases, self.state.last_success
        age = 0.0 if sent is None else max(0.0, self.state.clock() - sent)
        for c in charges:
            lease = leases.get(c.counter) if c.kind == "account" else None
            if lease is not None:
                out[c.counter] = msgspec.structs.replace(out[c.counter], lease=LeaseFigures(
                    allowance=lease.allowance, limit=lease.limit,
                    remaining=lease.remaining, age_s=round(age, 3)))
        return out

    async def admit(self, requests: list[AdmissionRequest]) -> list[Permit | Refusal]:
        results = await self._admit(requests)
        # A lease refusal (missing, used up or being released) while the heartbeat works:
        # one round trip for the early heartbeat it asked for, then decided once more. A
        # request that met a lease being released waits for that heartbeat first, then
        # (if its answer did not cover it) for the next, which carries its own ask.
        for _ in range(_ROUNDS):
            again = [i for i, r in enumerate(results) if self.state.waits(r)]
            if not again:
                break
            target = max(self.state.answer_target(requests[i]) for i in again)
            if not await self.state.next_answer(target):
                break
            for i, result in zip(again, await self._admit([requests[i] for i in again]),
                                 strict=True):
                results[i] = result
        return results

    async def _admit(self, requests: list[AdmissionRequest]) -> list[Permit | Refusal]:
        planned = [self.state.plan(req) for req in requests]
        admissible = [p for p in planned if isinstance(p, AdmissionRequest)]
        # Counted in flight from the plan (no await in between) until decided: a lease
        # released meanwhile reports them in its cap.
        holds = [self.state.hold(p) for p in admissible]
        try:
            decided = iter(await super().admit(admissible) if admissible else [])
        finally:
            for hold in holds:
                self.state.unhold(hold)
        results: list[Permit | Refusal] = []
        for original, plan in zip(requests, planned, strict=True):
            if isinstance(plan, Refusal):
                results.append(plan)
                continue
            result = next(decided)
            if isinstance(result, Refusal):
                result = self.state.refused(original, result)
            else:
                self.state.admitted(result)
            results.append(result)
        return results
