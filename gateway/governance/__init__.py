"""The admission/settlement seam (DESIGN §4–§5) and its stores.

Request path: :func:`build_request` plans every counter a call must reserve against;
the :class:`Governor` owns each permit's life: it admits all-or-none through a
:class:`GovernanceStore` (re-planning after a snapshot mismatch), journals dispatch and
the observed :class:`Outcome`, settles exactly once with the one :class:`Settlement`
:func:`settlement_for` computes (committed, liability, reserved: DESIGN §5), and replays
from its journal what the store could not take.
"""

from gateway.governance._admission import (
    MAX_DECISIONS,
    MAX_SNAPSHOT_RETRIES,
    Ask,
    Decided,
    Fit,
    Keys,
    Refinement,
    largest_output,
    remaining,
)
from gateway.governance._bounds import BYTE, COUNTED, FAILED, PREFIX, Bounds
from gateway.governance._counterkey import CounterKey
from gateway.governance._counters import CounterState
from gateway.governance._governor import Governor, Refused, is_snapshot_mismatch
from gateway.governance._import import CutoverReport, import_cutover, read_spend
from gateway.governance._journal import (
    Journal,
    JournalEntry,
    RejectedLine,
    boot_id,
    quarantine_files,
    read_journal,
    read_quarantine,
    recovered_outcome,
    scan_journal,
)
from gateway.governance._local import LocalGovernanceStore
from gateway.governance._model import (
    BUCKET_SCALE,
    AdmissionRequest,
    Charge,
    GovernanceStore,
    LeaseFigures,
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
    RefusalFigures,
    RequestFacts,
    Settlement,
    SettleResult,
    StoredFigures,
    UsageRow,
    is_slot,
)
from gateway.governance._ops import FrozenCounter, LogFilter, PermitInfo, SummaryFigures
from gateway.governance._plan import (
    bucket_admits,
    bucket_settle,
    build_request,
    check_settlement,
    plan_charges,
    refill,
    retry_after_seconds,
    settlement_fingerprint,
    soft_charges,
    tpm_estimate,
    utc_windows,
)
from gateway.governance._postgres import PostgresGovernanceStore
from gateway.governance._refusal import LeaseFacts, refusal
from gateway.governance._retention import Prunable, cutoff, prune, prune_forever
from gateway.governance._settle import settlement_for, split_settlement

# Re-exported for the app factory, which picks every shared-mode component here.
from gateway.policy import PostgresPolicySource

__all__ = [
    "BUCKET_SCALE",
    "MAX_SNAPSHOT_RETRIES",
    "CutoverReport",
    "Prunable",
    "RejectedLine",
    "check_settlement",
    "cutoff",
    "import_cutover",
    "is_snapshot_mismatch",
    "prune",
    "prune_forever",
    "quarantine_files",
    "read_quarantine",
    "read_spend",
    "scan_journal",
    "BYTE",
    "MAX_DECISIONS",
    "Ask",
    "Decided",
    "Fit",
    "Keys",
    "Refinement",
    "largest_output",
    "remaining",
    "COUNTED",
    "FAILED",
    "PREFIX",
    "Bounds",
    "AdmissionRequest",
    "Charge",
    "CounterKey",
    "CounterState",
    "FrozenCounter",
    "GovernanceStore",
    "Governor",
    "Journal",
    "JournalEntry",
    "LeaseFacts",
    "LocalGovernanceStore",
    "Outcome",
    "OutcomeKind",
    "Permit",
    "LogFilter",
    "PermitInfo",
    "PostgresGovernanceStore",
    "PostgresPolicySource",
    "Refusal",
    "RefusalFigures",
    "Refused",
    "SettleResult",
    "RequestFacts",
    "Settlement",
    "LeaseFigures",
    "StoredFigures",
    "SummaryFigures",
    "UsageRow",
    "bucket_admits",
    "boot_id",
    "bucket_settle",
    "build_request",
    "is_slot",
    "plan_charges",
    "soft_charges",
    "read_journal",
    "recovered_outcome",
    "refill",
    "refusal",
    "retry_after_seconds",
    "settlement_fingerprint",
    "settlement_for",
    "split_settlement",
    "tpm_estimate",
    "utc_windows",
]
