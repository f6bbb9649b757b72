"""The lease profile (ADR-034): node-local gateways under budget leases from inferplaned.

Shared by both binaries: the sync protocol's wire types (:mod:`._wire`) and the ledger's
arithmetic (:mod:`._ledger`, executed by ``sql/lease_v1.sql``).
"""

from gateway.lease._ledger import Account, LedgerRow, Report, sync
from gateway.lease._wire import (
    DATAPLANES_PATH,
    DEFAULT_HEARTBEAT_MS,
    EXPIRY_RENEWALS,
    PROTOCOL,
    SUPPORTED_API_VERSIONS,
    SYNC_PATH,
    AccountName,
    AccountReport,
    DataPlaneInfo,
    DataPlaneView,
    Ignored,
    LeaseGrant,
    LeaseView,
    Problem,
    Rejection,
    SyncRequest,
    SyncResponse,
    account_key,
    parse_account,
)

__all__ = [
    "DATAPLANES_PATH",
    "DEFAULT_HEARTBEAT_MS",
    "EXPIRY_RENEWALS",
    "PROTOCOL",
    "SUPPORTED_API_VERSIONS",
    "SYNC_PATH",
    "Account",
    "AccountName",
    "AccountReport",
    "DataPlaneInfo",
    "DataPlaneView",
    "Ignored",
    "LeaseGrant",
    "LeaseView",
    "LedgerRow",
    "Problem",
    "Rejection",
    "Report",
    "SyncRequest",
    "SyncResponse",
    "account_key",
    "parse_account",
    "sync",
]
