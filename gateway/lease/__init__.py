"""The lease profile (ADR-034): node-local gateways under budget leases from inferplaned.

Shared by both binaries: the sync protocol's wire types (:mod:`._wire`) and the ledger's
arithmetic (:mod:`._ledger`, executed by ``sql/lease.sql``). The data plane's side:
per-document application of the distributed set (:mod:`._apply`), the lease table with
clamp-and-gate (:mod:`._state`), the local store it bounds (:mod:`._store`), its SQLite
bookkeeping (:mod:`._local`) and the heartbeat that is its policy source
(:mod:`._client`). Both sides of the usage protocol's wire types (:mod:`._records`), and
the plane's spool that ships its request log to inferplaned (:mod:`._spool`).
"""

from gateway.lease._apply import AppliedPolicy, ManagedRule, apply_documents
from gateway.lease._client import LeaseClient
from gateway.lease._ledger import Account, LedgerRow, Report, sync
from gateway.lease._local import LeaseFile
from gateway.lease._records import MAX_RECORDS, USAGE_PATH, UsageAck, UsageBatch, UsageRecord
from gateway.lease._spool import DEFAULT_BOUND, UsageSpool
from gateway.lease._state import Lease, LeaseState
from gateway.lease._store import LeaseGovernanceStore
from gateway.lease._wire import (
    DATAPLANES_PATH,
    DEFAULT_HEARTBEAT_MS,
    EXPIRY_RENEWALS,
    PROTOCOL,
    SUPPORTED_API_VERSIONS,
    SYNC_PATH,
    WINDOW_GRACE_S,
    AccountReport,
    BrokeredKey,
    DataPlaneInfo,
    DataPlaneView,
    DeniedKey,
    Ignored,
    LeaseGrant,
    LeaseView,
    People,
    Problem,
    Rejection,
    SyncRequest,
    SyncResponse,
)

__all__ = [
    "DEFAULT_BOUND",
    "MAX_RECORDS",
    "USAGE_PATH",
    "UsageAck",
    "UsageBatch",
    "UsageRecord",
    "UsageSpool",
    "AppliedPolicy",
    "Lease",
    "LeaseClient",
    "LeaseFile",
    "LeaseGovernanceStore",
    "LeaseState",
    "ManagedRule",
    "apply_documents",
    "DATAPLANES_PATH",
    "DEFAULT_HEARTBEAT_MS",
    "EXPIRY_RENEWALS",
    "PROTOCOL",
    "SUPPORTED_API_VERSIONS",
    "SYNC_PATH",
    "WINDOW_GRACE_S",
    "Account",
    "AccountReport",
    "BrokeredKey",
    "DataPlaneInfo",
    "DataPlaneView",
    "DeniedKey",
    "Ignored",
    "LeaseGrant",
    "LeaseView",
    "LedgerRow",
    "People",
    "Problem",
    "Rejection",
    "Report",
    "SyncRequest",
    "SyncResponse",
    "sync",
]
