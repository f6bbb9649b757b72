"""The sync protocol (``POST /v1alpha1/sync``) between a lease-profile mayu and inferplaned.

Defined once, imported by both binaries (like the GovernancePolicy wire types), so a
schema skew between them is an import error rather than a surprise (ADR-031). One
heartbeat carries four jobs in one round trip (ADR-034 §1): the policy pull (documents
are omitted when the plane already holds the published fingerprint), the cumulative
consumption report per lease-managed account, the lease renewal, and the per-document
rejections with the API versions this build supports.

Units: the protocol is a machine channel and speaks exact integer µUSD (ADR-034 §1);
policy documents keep their operator-facing milliUSD.

An *account* is one lease-managed budget rule for one scope in one UTC calendar window,
named exactly like the counter both gateway profiles charge
(``account:<rule uid>:<scope>:<day|month>:<period>``, built and read by
:class:`gateway.governance.CounterKey`), which is also its row key in the shared
``authority_accounts`` table: the ledger and shared admission meet on one row.

Unknown fields are tolerated in both directions (not forbidden, unlike policy
documents): a newer control plane may add fields an older plane ignores, while what a
plane cannot enforce is always reported explicitly as a rejection.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec

from gateway.ceilings import MAX_AMOUNT

SYNC_PATH = "/v1alpha1/sync"
DATAPLANES_PATH = "/v1alpha1/dataplanes"
PROTOCOL = "inferplane.dev/v1alpha1"
SUPPORTED_API_VERSIONS = ("inferplane.dev/v1alpha1",)
"""The GovernancePolicy API versions this build can enforce (reported every heartbeat)."""

DEFAULT_HEARTBEAT_MS = 60_000
"""Heartbeat cadence when no lease-managed rule sets ``lease.renewInterval`` (ADR-034)."""
EXPIRY_RENEWALS = 3
"""A lease expires after this many renew intervals without a successful heartbeat."""

Micro = Annotated[int, msgspec.Meta(ge=0, le=MAX_AMOUNT)]
"""A µUSD figure of one account: at most what one charge may carry."""
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
AccountKey = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


# msgspec subclasses inherit frozen=True at runtime, but type checkers follow PEP 681
# (dataclass_transform), which does not inherit them; each subclass repeats frozen and
# kw_only.
class _Wire(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    pass


class Problem(_Wire, frozen=True, kw_only=True):
    path: str
    message: str


class Rejection(_Wire, frozen=True, kw_only=True):
    """A published document this plane keeps out of its applied set, and why."""

    name: str
    problems: list[Problem]


class AccountReport(_Wire, frozen=True, kw_only=True):
    """A plane's cumulative figures for one account, in its counter store's frame."""

    key: AccountKey
    rule_uid: Name
    committed: Micro = 0
    liability: Micro = 0
    reserved: Micro = 0
    want: Micro = 0
    """The largest single charge refused locally for lack of allowance since the last
    heartbeat: the ledger grants at least this much when the budget has it, so a request
    larger than the configured grant size can still be admitted."""


class DataPlaneInfo(_Wire, frozen=True, kw_only=True):
    id: Name
    build: str = ""
    api_versions: list[str] = []


class SyncRequest(_Wire, frozen=True, kw_only=True):
    protocol: str = PROTOCOL
    dataplane: DataPlaneInfo
    frame: Name
    """Identity of the plane's counter store; a new frame means fresh counters."""
    boot: Name
    """Identity of this process; with ``seq`` it orders the heartbeats of one process."""
    seq: Annotated[int, msgspec.Meta(ge=0)]
    fingerprint: str = ""
    """Fingerprint of the published set the plane last received (policy pull skipped
    when it is still the published one)."""
    applied_generation: Annotated[int, msgspec.Meta(ge=0)] = 0
    rejections: list[Rejection] = []
    accounts: list[AccountReport] = []


class LeaseGrant(_Wire, frozen=True, kw_only=True, omit_defaults=False):
    """The allowance an account's lease gives the plane, in its frame (cumulative)."""

    key: str
    rule_uid: str
    allowance: int
    renew_ms: int
    committed: int = 0
    liability: int = 0
    reserved: int = 0
    grant: int = 0
    """Grant size the ledger applied (0: no grant, e.g. the window has ended)."""
    remaining: int = 0
    """What the budget had left for anyone after this grant (never negative)."""
    limit: int | None = None
    open: bool = True
    """False when the account takes no new grant (its window ended, its rule is gone,
    it is frozen): the plane may not admit beyond its allowance into it."""


class Ignored(_Wire, frozen=True, kw_only=True):
    key: str
    reason: str


class SyncResponse(_Wire, frozen=True, kw_only=True, omit_defaults=False):
    protocol: str = PROTOCOL
    namespace: str
    generation: int
    fingerprint: str
    documents: dict[str, dict[str, Any]] | None = None
    """The whole published set, or None when the request's fingerprint matched."""
    heartbeat_ms: int = DEFAULT_HEARTBEAT_MS
    day: str
    month: str
    """The control plane's current UTC windows (it owns them)."""
    leases: list[LeaseGrant] = []
    ignored: list[Ignored] = []
    applied: bool = True
    """False when the request was an older heartbeat of the same process than one the
    ledger already applied (a late retry): nothing was changed, the stored leases are
    returned as they are."""


class LeaseView(_Wire, frozen=True, kw_only=True, omit_defaults=False):
    """One plane's ledger row for one account, as ``GET /v1alpha1/dataplanes`` shows it."""

    account: str
    rule_uid: str | None = None
    frame: str
    allowance: int
    committed: int
    liability: int
    reserved: int
    prior_committed: int = 0
    prior_unobserved: int = 0
    adoptions: int = 0
    renew_ms: int
    expires_at: datetime | None = None
    updated_at: datetime | None = None


class DataPlaneView(_Wire, frozen=True, kw_only=True, omit_defaults=False):
    id: str
    token_name: str
    build: str
    api_versions: list[str]
    frame: str
    applied_generation: int | None = None
    rejections: list[Rejection] = []
    heartbeat_ms: int | None = None
    first_heartbeat: datetime
    last_heartbeat: datetime
    heartbeats: int
    connected: bool = False
    """Its last heartbeat is younger than its leases' expiry (3 heartbeat intervals)."""
    leases: list[LeaseView] = []
