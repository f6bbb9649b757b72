"""The admission/settlement seam: what a store is asked to do, and what it answers.

Python decides *which* limits apply to a request (:mod:`gateway.governance._plan`); a
store (local SQLite or shared Postgres) executes the plan atomically. Every limit is a
counter named by a stable key:

- a **bucket** (RPM/TPM token bucket refilled from the store's clock, exact fixed point,
  may hold debt after a true-up);
- a **window** (explicit UTC calendar window: tokens or µUSD, ``limit`` ``None`` = track
  only);
- an **account** (a policy monetary budget in ``authority_accounts``; competes with
  outstanding lease grants for the same account).

A window of dimension ``requests`` is an **in-flight slot** counter (a concurrency rule's,
no calendar period): its reservations are the requests open now (:func:`is_slot`).

A Permit records every :class:`Charge` it made with its captured window, so settlement
uses those even after a policy edit, a deletion or midnight.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Literal, Protocol

import msgspec

from gateway.pricing import Usage

if TYPE_CHECKING:  # _ops builds on this module
    from gateway.governance._ops import LogFilter, PermitInfo, SummaryFigures

CounterKind = Literal["bucket", "window", "account"]
Dimension = Literal["requests", "tokens", "usd"]

# A bucket's balance is kept in units of 1/60_000_000 token: a bucket of capacity C
# tokens per minute then refills exactly C units per microsecond, so refill is integer
# arithmetic with no remainder to lose, whatever the elapsed time.
BUCKET_SCALE = 60_000_000


class Charge(msgspec.Struct, frozen=True, kw_only=True):
    """One counter one admission reserves against."""

    counter: str
    """Stable counter key, e.g. ``team:<id>:tpm`` or ``key:<id>:usd:day:2026-11-29``."""
    kind: CounterKind
    dimension: Dimension
    amount: int
    """Reserved amount: requests, tokens or µUSD (never scaled)."""
    limit: int | None
    """Bucket capacity per minute, window/account limit; ``None`` = track only."""
    window: str | None = None
    """The captured calendar window (``2026-11-29`` or ``2026-11``) for windows/accounts."""
    rule_uid: str | None = None
    hard: bool = True
    fit_floor: int | None = None
    """Budget fit is allowed on this window/account down to this output allowance
    (the team's ``budget_fit_floor`` or the rule's ``onShortfall: fit``); None: refuse."""
    scope: str | None = None
    """An account's rule scope (``team=<name>`` …), stored on the account row it creates,
    so the database never takes a counter key apart."""


class AdmissionRequest(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    key_id: str
    key_revision: int
    team_id: str
    team_revision: int
    user: str | None
    model: str
    token_bound: int
    usd_bound: int
    policy_generation: int
    charges: tuple[Charge, ...]
    day: str
    month: str


class Permit(msgspec.Struct, frozen=True, kw_only=True):
    """A granted reservation. Settled exactly once."""

    id: str
    request: AdmissionRequest
    buckets: dict[str, int] = {}
    """Each charged bucket's balance (BUCKET_SCALE units) right after this reservation,
    as admission read it: the remaining-limit headers come from here, no extra read."""


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    status: int
    """429 (rate/tokens), 402 (money), 503 (storage or snapshot mismatch)."""
    reason: str
    counter: str | None = None
    retry_after: int | None = None
    code: str | None = None
    """Machine-readable cause, e.g. ``snapshot_mismatch`` (re-plannable before dispatch)."""
    figures: RefusalFigures | None = None
    """The numbers the refusing counter held when it refused (both stores fill them)."""


class RefusalFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What a refusing window, account or bucket held: enough to say what to do."""

    limit: int | None = None
    committed: int = 0
    liability: int = 0
    reserved: int = 0
    leased: int = 0
    """Outstanding lease grants on a policy account (ADR-034)."""
    amount: int = 0
    """This request's charge on the counter (its worst case for money and quotas)."""
    window: str | None = None
    dimension: str = "usd"


class OutcomeKind(enum.StrEnum):
    COMPLETE = "complete"
    """Usage known for every class: commit actuals, release the rest."""
    TOKENS_KNOWN = "tokens_known"
    """Token counts known, price uncertain (cache-write TTL unreported): tokens commit
    exactly, money at the cheaper class, the difference to the dearer one is liability."""
    UNCERTAIN = "uncertain"
    """Partial, missing or ambiguous (stream cut, timeout after dispatch, disconnect):
    what was observed commits, the rest of the bound is liability."""
    INVALID = "invalid"
    """Upstream usage was invalid: freeze the affected accounts, free the in-flight
    slots, change no other counter."""
    CANCELLED = "cancelled"
    """Nothing left the gateway: full refund."""


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What the wire told the gateway about one attempt (the ingress's observation).

    :func:`gateway.governance.settlement_for` turns it into the one :class:`Settlement`
    the store executes; nobody else computes commits.
    """

    kind: OutcomeKind
    usage: Usage | None = None
    """Usage the wire reported: final for COMPLETE/TOKENS_KNOWN, what arrived before the
    cut for UNCERTAIN (e.g. Anthropic's ``message_start`` input and cache classes)."""
    output_floor: int = 0
    """Output tokens proven by content already relayed (one per non-empty delta)."""
    detail: str = ""


class RequestFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What the request log keeps of a request beyond its permit (``permit_facts``): the
    route it came in by, the deployment that answered, the client tool its User-Agent
    names and the HTTP status the client got. Never part of the settlement's figures or
    fingerprint."""

    route: str | None = None
    deployment: str | None = None
    client: str | None = None
    http_status: int | None = None


class Settlement(msgspec.Struct, frozen=True, kw_only=True):
    """One permit's settlement, computed once: the three figures and every counter's part.

    ``commits`` maps each charged counter to what it commits (requests, tokens or µUSD;
    a bucket is trued up to it); ``liabilities`` maps windows/accounts to the unobserved
    remainder they keep binding. An INVALID settlement commits nothing (empty maps).
    """

    kind: OutcomeKind
    detail: str = ""
    tokens_committed: int = 0
    usd_committed: int = 0
    tokens_liability: int = 0
    usd_liability: int = 0
    bound_exceeded: bool = False
    """Valid usage above the admitted bound, committed in full (DESIGN §5)."""
    commits: dict[str, int] = {}
    liabilities: dict[str, int] = {}
    usage: Usage | None = None
    facts: RequestFacts | None = None
    """For the request log only (with ``usage``'s classes): kept once per permit."""


class SettleResult(msgspec.Struct, frozen=True, kw_only=True):
    permit_id: str
    kind: OutcomeKind
    tokens_committed: int
    usd_committed: int
    tokens_liability: int = 0
    usd_liability: int = 0
    bound_exceeded: bool = False
    replay: bool = False


class UsageRow(msgspec.Struct, frozen=True, kw_only=True):
    """One line of ``GET /v1/usage``: the three figures (DESIGN §5) in tokens and µUSD."""

    scope: Literal["key", "team", "user"]
    id: str
    window: Literal["day", "month"]
    period: str
    tokens_committed: int
    tokens_reserved: int
    usd_committed: int
    usd_reserved: int
    requests: int
    tokens_liability: int = 0
    usd_liability: int = 0


class LeaseFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What a lease-profile plane knows of a policy budget beyond its own counters, as of
    its last answered heartbeat."""

    allowance: int
    """What this plane may take of the account (its lease)."""
    limit: int | None
    """The budget's global limit."""
    remaining: int
    """What the budget had left for anyone after this plane's grant."""
    age_s: float
    """Seconds since the heartbeat that brought these figures."""


class StoredFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One counter as a reader sees it at ``now_us`` (the store's clock, µs since the
    epoch): a bucket's balance refilled to then (BUCKET_SCALE units, may be negative:
    debt), a window's or account's three figures; a counter never charged reads as it
    would be born (a full bucket, an empty window)."""

    now_us: int
    balance: int | None = None
    """Buckets only."""
    reserved: int = 0
    committed: int = 0
    liability: int = 0
    leased: int = 0
    """Accounts in the shared profile: what lease grants hold of the budget."""
    frozen: bool = False
    lease: LeaseFigures | None = None
    """Accounts on a lease-profile plane: its lease and the budget's global figures."""


def is_slot(charge: Charge) -> bool:
    """Whether a charge is an in-flight slot (a concurrency rule's): a requests window,
    reserved 1 at admission and freed by every settlement, invalid ones included."""
    return charge.kind == "window" and charge.dimension == "requests"


def born_figures(charge: Charge, now_us: int) -> StoredFigures:
    """A counter no admission has created yet: a full bucket, an empty window."""
    full = (charge.limit or 0) * BUCKET_SCALE if charge.kind == "bucket" else None
    return StoredFigures(now_us=now_us, balance=full)


class GovernanceStore(Protocol):
    """Executes admission plans and settlements atomically."""

    async def admit(self, requests: list[AdmissionRequest]) -> list[Permit | Refusal]:
        """Decide several admissions in one atomic step (each all-or-none on its own)."""

    async def settle(self, permit_id: str, settlement: Settlement) -> SettleResult:
        """Settle once, as ``settlement`` says (:func:`gateway.governance.settlement_for`).

        An exact replay returns the first result with ``replay=True``; a different
        settlement raises :class:`gateway.errors.SettlementConflict`.
        """

    async def resolve(self, permit_id: str, settlement: Settlement) -> SettleResult:
        """Replace an uncertain (or tokens-known) permit's liability by an exact figure
        (an operator's or the provider's); a pending permit is settled with it."""

    async def get_permit(self, permit_id: str) -> Permit | None: ...

    async def current_generation(self) -> int: ...

    async def usage(self, *, day: str, month: str, key_id: str | None = None,
                    team_id: str | None = None) -> list[UsageRow]:
        """Committed, liability and reserved tokens and µUSD per key, team and user, for
        the day and month windows; filtered to one key and its team, or everything when
        both are None.
        """

    async def request_log(self, f: LogFilter, *, limit: int | None) -> list[PermitInfo]:
        """Permits newest first, as ``f`` selects them, at most ``limit`` (the request
        log of the admin API)."""

    async def request_summary(self, f: LogFilter, *, groups: tuple[str, ...],
                              bucket: str) -> list[SummaryFigures]:
        """The permits ``f`` selects summed per asked group (``team``, ``user``, ``key``,
        ``model``, ``tool``) and UTC period (``day``, ``hour``, ``none``) as
        ``/v1/usage`` counts them, by the store (the admin API's summary)."""

    async def note_tier(self, permit_id: str, tier: str) -> None:
        """Record in the request log that ``tier`` served the permit's attempt (the
        ``soft`` tier of ``routing.soft_tier``); the first note stays."""

    async def figures(self, charges: list[Charge]) -> dict[str, StoredFigures]:
        """What each of ``charges``' counters holds now, read in one step (no charge is
        made: the amounts are ignored, the limits give the buckets' capacities)."""

    async def close(self) -> None: ...
