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

Every field a plane sends is bounded here (numbers, string lengths, list sizes), so a
heartbeat the ledger could not store is a 400 naming the field's path, never a database
error; names carry no control characters (they reach inferplaned's log).
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

MAX_SEQ = 2**53 - 1
"""Largest heartbeat number or generation a plane may send (exact in JSON and bigint)."""
MAX_ACCOUNTS = 10_000
"""Accounts one heartbeat may report (a bound on the work of one transaction)."""
MAX_TEAMS = 10_000
"""Teams one heartbeat may name (a plane's key store, ``teams``)."""
MAX_REJECTIONS = 1_000
"""Rejected documents one heartbeat may report (a plane sends the first ones)."""
WINDOW_GRACE_S = 1_800
"""How long around a UTC window boundary the control plane accepts the adjacent window:
the previous day's (month's) accounts for this long after midnight, the next one's for
this long before it. A plane reports a previous window only within half of it."""

MAX_NAME, MAX_KEY, MAX_TEAM_NAME, MAX_TEXT, MAX_PROBLEMS = 253, 1024, 1024, 4096, 100
"""Longest plane id, frame, rule uid or document name; account key; team name; problem
text; problems per rejected document."""

_PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
Micro = Annotated[int, msgspec.Meta(ge=0, le=MAX_AMOUNT)]
"""A µUSD figure of one account: at most what one charge may carry."""
Seq = Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME, pattern=_PRINTABLE)]
AccountKey = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KEY, pattern=_PRINTABLE)]
TeamName = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEAM_NAME,
                                        pattern=_PRINTABLE)]
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]


# msgspec subclasses inherit frozen=True at runtime, but type checkers follow PEP 681
# (dataclass_transform), which does not inherit them; each subclass repeats frozen and
# kw_only.
class _Wire(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    pass


class Problem(_Wire, frozen=True, kw_only=True):
    path: Text
    message: Text


class Rejection(_Wire, frozen=True, kw_only=True):
    """A published document this plane keeps out of its applied set, and why."""

    name: Annotated[str, msgspec.Meta(max_length=MAX_NAME)]
    problems: Annotated[list[Problem], msgspec.Meta(max_length=MAX_PROBLEMS)]


class AccountReport(_Wire, frozen=True, kw_only=True):
    """A plane's cumulative figures for one account, in its counter store's frame."""

    key: AccountKey
    rule_uid: AccountKey
    committed: Micro = 0
    liability: Micro = 0
    reserved: Micro = 0
    want: Micro = 0
    """The headroom the plane asks for beyond what it holds: what its admissions on the
    account reserved over the last renew interval, and at least the largest charge it
    refused for lack of allowance since the last heartbeat (the ledger grants up to this
    much, so grants follow the request bounds the plane actually sees)."""
    need: Micro = 0
    """The largest charge refused for lack of allowance since the last heartbeat: with a
    ``cap``, a grant smaller than this is not given (it could not admit the request)."""
    cap: Micro | None = None
    """Set when the plane releases allowance it does not need (the account is idle, or
    what is left does not fit the charge it refused): from before it read these figures
    until the answer, it admits nothing beyond ``cap`` on the account, so the ledger
    lowers the allowance to ``max(cap, held)`` and grants exactly ``want``."""


class DataPlaneInfo(_Wire, frozen=True, kw_only=True):
    id: Name
    build: Annotated[str, msgspec.Meta(max_length=MAX_NAME, pattern=_PRINTABLE)] = ""
    api_versions: Annotated[list[Name], msgspec.Meta(max_length=16)] = []


class SyncRequest(_Wire, frozen=True, kw_only=True):
    protocol: str = PROTOCOL
    dataplane: DataPlaneInfo
    frame: Name
    """Identity of the plane's counter store; a new frame means fresh counters."""
    boot: Name
    """Identity of this process; with ``seq`` it orders the heartbeats of one process."""
    seq: Seq
    fingerprint: Annotated[str, msgspec.Meta(max_length=128)] = ""
    """Fingerprint of the published set the plane last received (policy pull skipped
    when it is still the published one)."""
    applied_generation: Seq = 0
    rejections: Annotated[list[Rejection], msgspec.Meta(max_length=MAX_REJECTIONS)] = []
    accounts: Annotated[list[AccountReport], msgspec.Meta(max_length=MAX_ACCOUNTS)] = []
    teams: Annotated[list[TeamName], msgspec.Meta(max_length=MAX_TEAMS)] = []
    """The teams of the plane's key store: a team-scoped account of any other team is
    ignored (a plane leases only the teams it can serve)."""
    people: Annotated[str, msgspec.Meta(max_length=128)] = ""
    """Fingerprint of the brokered keys the plane last applied (:class:`People`): the
    answer carries them again only when they changed."""


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


class BrokeredKey(_Wire, frozen=True, kw_only=True, omit_defaults=False):
    """A key inferplaned brokers credentials for (docs/identity.md), or a key made at
    inferplaned (docs/inferplaned.md): its hash only; a plane resolves a verified
    credential's ``kh``, or a presented key's hash, to it and admits the request as this
    key's team and user."""

    id: str
    team: str
    user: str
    """The key's user; ``""`` for a key of no user (a key made at inferplaned)."""
    key_hash: str
    brokered: bool = True
    """False for a plain key made at inferplaned's admin surface (``POST
    /v1alpha1/teams/{team}/keys``): its secret exists, held by whoever made it."""
    name: str = "brokered credential"


class DeniedKey(_Wire, frozen=True, kw_only=True, omit_defaults=False):
    """A brokered key revoked (its user was revoked), and when: the deny list."""

    id: str
    team: str
    user: str
    revoked_at: datetime


class People(_Wire, frozen=True, kw_only=True, omit_defaults=False):
    """The brokered keys of the plane's teams, and the deny list (ADR-031 on the lease
    profile): a plane holds exactly ``keys`` as its brokered keys (any other one it
    holds is revoked, when ``complete``) and revokes each of ``denied`` at its time."""

    fingerprint: str
    keys: list[BrokeredKey] = []
    denied: list[DeniedKey] = []
    """Brokered keys revoked within the longest credential lifetime (older ones can no
    longer be presented by an unexpired credential)."""
    complete: bool = True
    """False when ``keys`` was cut at its bound: the plane then revokes only ``denied``."""


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
    people: People | None = None
    """The brokered keys and deny list, when they differ from the request's ``people``
    fingerprint (None: unchanged, or a control plane that brokers no credentials)."""


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
    """The first heartbeat of the plane's current frame (counter store)."""
    last_heartbeat: datetime
    heartbeats: int
    frame_changes: int = 0
    """New counter stores accepted after the first, as the plane's ledger rows saw them
    (the most adoptions of any one of its accounts)."""
    connected: bool = False
    """Its last heartbeat is younger than its leases' expiry (3 heartbeat intervals)."""
    leases: list[LeaseView] = []
