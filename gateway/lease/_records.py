"""The usage protocol (``POST /v1alpha1/usage``): a lease plane's request log, shipped.

Defined once, imported by both binaries (as the sync protocol, :mod:`._wire`). A plane
sends batches of :class:`UsageRecord` — one per settled request: who (key id, team
name, user), which model, when, the bounds it reserved, the outcome, committed and
liability in tokens and integer µUSD, and the request log's facts (route, deployment,
client tool, HTTP status, tokens per class). Never a payload: no prompt, no answer, no
header. inferplaned answers with a :class:`UsageAck`: the record ids it stored now,
those it held already for this plane (a replayed batch), those another plane (or the
shared profile) holds under the same id, and those of a team the plane's data-plane
token may not report (refused); the plane deletes them all from its spool.

A record's id is the plane's permit id (a random 128-bit id): idempotence is per
(plane, permit id), which is finer than (plane, request id) — a request's retries and
fallbacks are permits of their own under one request id, each shipped once.

Every field is bounded here, so a batch the database could not store is a 400 naming
the field's path, never a database error.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gateway.ceilings import MAX_AMOUNT
from gateway.lease._wire import MAX_NAME, MAX_TEAM_NAME, MAX_TEXT, Name, TeamName

USAGE_PATH = "/v1alpha1/usage"
MAX_RECORDS = 500
"""Records one batch may carry (a plane sends at most this many per POST)."""
MAX_DETAIL = 1_000
"""A settlement's detail is cut to this many characters when spooled."""

_PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
_I64 = 2**63 - 1
PermitId = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{32}$")]
Micro = Annotated[int, msgspec.Meta(ge=0, le=MAX_AMOUNT)]
Count = Annotated[int, msgspec.Meta(ge=0, le=_I64)]
Us = Annotated[int, msgspec.Meta(ge=0, le=2**53 - 1)]
Label = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME, pattern=_PRINTABLE)]
Period = Annotated[str, msgspec.Meta(pattern=r"^\d{4}-\d{2}(-\d{2})?$")]
Status = Literal["complete", "tokens_known", "uncertain", "invalid", "cancelled"]


class _Wire(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    pass


class UsageRecord(_Wire, frozen=True, kw_only=True):
    """One settled request of a plane, as its request log holds it (no payload)."""

    id: PermitId
    request_id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT,
                                            pattern=_PRINTABLE)]
    key_id: Label
    team: TeamName
    """The team's name (a plane's team ids are its own; names are what a data-plane
    token's ``teams`` lists)."""
    user: Annotated[str, msgspec.Meta(max_length=MAX_TEAM_NAME)] | None = None
    model: Label
    status: Status
    generation: Count
    day: Period
    month: Period
    token_bound: Count
    usd_bound: Micro
    created_us: Us
    """Admission time, µs since the epoch (the plane's clock)."""
    settled_us: Us
    resolved_us: Us | None = None
    fingerprint: Annotated[str, msgspec.Meta(max_length=MAX_NAME)] = ""
    tokens_committed: Count = 0
    usd_committed: Micro = 0
    tokens_liability: Count = 0
    usd_liability: Micro = 0
    bound_exceeded: bool = False
    detail: Annotated[str, msgspec.Meta(max_length=MAX_DETAIL)] = ""
    route: Label | None = None
    deployment: Label | None = None
    client: Label | None = None
    http_status: Annotated[int, msgspec.Meta(ge=0, le=999)] | None = None
    input: Count | None = None
    output: Count | None = None
    cache_read: Count | None = None
    cache_write_5m: Count | None = None
    cache_write_1h: Count | None = None
    cache_write_unknown: Count | None = None


class UsageBatch(_Wire, frozen=True, kw_only=True):
    """A plane's records, oldest first; ``plane`` is its data-plane id."""

    plane: Name
    records: Annotated[list[UsageRecord], msgspec.Meta(max_length=MAX_RECORDS)]


class UsageAck(msgspec.Struct, frozen=True, kw_only=True):
    """Which ids of a batch inferplaned holds: stored by this batch, held already for
    this plane (a replay), held under another plane's name (a collision: never
    overwritten), refused (a team the plane's token may not report: never stored). Ids
    in none of them (a concurrent replay still committing) are sent again."""

    stored: list[str] = []
    present: list[str] = []
    conflicts: list[str] = []
    refused: list[str] = []
