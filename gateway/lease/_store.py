"""The lease profile's governance store: the local store, bounded by leases.

Counters, permits and settlements are the local profile's, exact and persisted in the
plane's own SQLite file (:class:`gateway.governance.LocalGovernanceStore`); only
admission differs. Each request first passes :meth:`gateway.lease.LeaseState.plan`
(clamp and gate, in memory), then the local store's own all-or-none transaction, whose
hard-limit check then holds every lease-managed account within its allowance. Nothing on
this path talks to the control plane.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from gateway.governance import AdmissionRequest, LocalGovernanceStore, Permit, Refusal
from gateway.lease._state import LeaseState


class LeaseGovernanceStore(LocalGovernanceStore):
    """A :class:`LocalGovernanceStore` whose admissions are clamped and gated by leases."""

    def __init__(self, path: str, *, state: LeaseState,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 max_batch: int = 64) -> None:
        super().__init__(path, clock=clock, max_batch=max_batch)
        self.state = state

    async def admit(self, requests: list[AdmissionRequest]) -> list[Permit | Refusal]:
        planned = [self.state.plan(req) for req in requests]
        admissible = [p for p in planned if isinstance(p, AdmissionRequest)]
        decided = iter(await super().admit(admissible) if admissible else [])
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
