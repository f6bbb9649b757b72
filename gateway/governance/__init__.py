"""The admission/settlement seam (DESIGN §4–§5) and its stores.

Request path: :func:`build_request` plans every counter a call must reserve against;
a :class:`GovernanceStore` admits it all-or-none into a :class:`Permit`; after dispatch
the permit is settled exactly once with an :class:`Outcome` (:func:`commits_for` says
what each counter keeps).
"""

from gateway.governance._counters import CounterState
from gateway.governance._local import LocalGovernanceStore
from gateway.governance._model import (
    BUCKET_SCALE,
    AdmissionRequest,
    Charge,
    GovernanceStore,
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
    SettleResult,
    UsageRow,
)
from gateway.governance._ops import FrozenCounter, PermitInfo
from gateway.governance._plan import (
    bucket_admits,
    bucket_settle,
    build_request,
    commits_for,
    plan_charges,
    refill,
    retry_after_seconds,
    settled_amounts,
    utc_windows,
)
from gateway.governance._postgres import PostgresGovernanceStore

# Re-exported for the app factory, which picks every shared-mode component here.
from gateway.policy._pgstore import PostgresPolicySource

__all__ = [
    "BUCKET_SCALE",
    "AdmissionRequest",
    "Charge",
    "CounterState",
    "FrozenCounter",
    "GovernanceStore",
    "LocalGovernanceStore",
    "Outcome",
    "OutcomeKind",
    "Permit",
    "PermitInfo",
    "PostgresGovernanceStore",
    "PostgresPolicySource",
    "Refusal",
    "SettleResult",
    "UsageRow",
    "bucket_admits",
    "bucket_settle",
    "build_request",
    "commits_for",
    "plan_charges",
    "refill",
    "retry_after_seconds",
    "settled_amounts",
    "utc_windows",
]
