"""The admin API's bodies: what it reads and answers (its OpenAPI schema is made from
these). Keys are shown by their public id and display prefix, never their hash; a
secret appears once, in the answer that created it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal, TypeVar

import msgspec

from gateway.errors import NotFound
from gateway.keys import MAX_GRACE_S, KeyChanges, KeyLimits, KeyRecord, Team, TeamLimits

_EDGE = r"[^\x00-\x20\x7f-\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
_INNER = r"[^\x00-\x1f\x7f-\x9f]"
# Spelt out, not \s: JSON Schema's regexes (ECMA-262) and Python's disagree on \s.
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200,
                                   pattern=f"^{_EDGE}(?:{_INNER}*{_EDGE})?$")]
"""A team, user or model name: printable, no leading or trailing space."""
KeyStatus = Literal["active", "revoked", "expired"]
T = TypeVar("T")


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    message: str
    type: str
    param: str | None
    code: str


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """Every error of the admin API (OpenAI's shape)."""

    error: ErrorDetail


class TeamView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    revision: int
    """Compare with If-Match on a write (also the ETag)."""
    limits: TeamLimits
    region: str | None = None
    guardrails: list[str] = []
    created_at: datetime | None = None


Profiles = Annotated[list[Annotated[str, msgspec.Meta(
    pattern=r"^[a-z][a-z0-9_-]{0,39}$")]], msgspec.Meta(max_length=16)]
"""A team's guardrail profile names: at most 16 lowercase labels."""


class TeamCreate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Name
    limits: TeamLimits = TeamLimits()
    guardrails: Profiles = []
    """The guardrail profiles the team opts into (docs/guardrails.md, "Per team")."""


class TeamPatch(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The fields to change; a field left out keeps its value (``limits`` is replaced as
    a whole)."""

    guardrails: Profiles | msgspec.UnsetType = msgspec.UNSET
    """The team's guardrail profiles, replacing its list (``[]``: none); each one of the
    gateway config's ``guardrails.profiles``."""
    limits: TeamLimits | msgspec.UnsetType = msgspec.UNSET


class TeamPage(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["list"] = "list"
    data: list[TeamView]
    next_cursor: str | None = None
    """Pass as ``cursor`` for the next page; None on the last one."""


class KeyView(msgspec.Struct, frozen=True, kw_only=True):
    key_id: str
    """Immutable public id (the path of every key route)."""
    team_id: str
    display_prefix: str
    name: str
    user: str | None
    allowed_models: list[str] | None
    """None: every model; []: none."""
    limits: KeyLimits
    expires_at: datetime | None
    revoked_at: datetime | None
    status: KeyStatus
    revision: int
    created_at: datetime | None
    last_used_at: datetime | None = None
    """When the key was last admitted (its newest request in the log; None: never, or
    not since the log's retention pruned it)."""


class KeyCreate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    team: Name
    """The team's name or id."""
    name: Annotated[str, msgspec.Meta(max_length=200, pattern=f"^{_INNER}*$")] = ""
    user: Name | None = None
    allowed_models: list[Name] | None = None
    limits: KeyLimits = KeyLimits()
    expires_at: datetime | None = None


class KeyPatch(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The fields to change; a field left out keeps its value (``limits`` is replaced as
    a whole; ``null`` clears ``user``, ``allowed_models`` (every model) or
    ``expires_at``)."""

    name: Annotated[str, msgspec.Meta(max_length=200, pattern=f"^{_INNER}*$")] | \
        msgspec.UnsetType = msgspec.UNSET
    user: Name | None | msgspec.UnsetType = msgspec.UNSET
    allowed_models: list[Name] | None | msgspec.UnsetType = msgspec.UNSET
    limits: KeyLimits | msgspec.UnsetType = msgspec.UNSET
    expires_at: datetime | None | msgspec.UnsetType = msgspec.UNSET

    def changes(self) -> KeyChanges:
        models = self.allowed_models
        return KeyChanges(name=self.name, user=self.user, limits=self.limits,
                          expires_at=self.expires_at,
                          allowed_models=(tuple(models) if isinstance(models, list)
                                          else models))


class KeyCreated(msgspec.Struct, frozen=True, kw_only=True):
    key: KeyView
    secret: str
    """The key itself (``sk-inf-…``): shown in this answer only, never again."""


class KeyRotate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    grace_seconds: Annotated[int, msgspec.Meta(ge=0, le=MAX_GRACE_S)] = 86400
    """How long the replaced secret keeps working (0: not at all; at most 30 days)."""


class KeyRotated(msgspec.Struct, frozen=True, kw_only=True):
    key: KeyView
    secret: str
    """The key's new secret: in this answer (and a retry's with the same
    Idempotency-Key) only."""
    previous_valid_until: datetime
    """Until when the replaced secret still authenticates the key."""
    replayed: bool
    """This answers a retry of an earlier rotation (same Idempotency-Key)."""


class KeyPage(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["list"] = "list"
    data: list[KeyView]
    next_cursor: str | None = None


def team_view(team: Team) -> TeamView:
    return TeamView(id=team.id, name=team.name, revision=team.revision, limits=team.limits,
                    region=team.region, guardrails=list(team.guardrails),
                    created_at=team.created_at)


def key_view(key: KeyRecord, now: datetime | None = None) -> KeyView:
    return KeyView(key_id=key.id, team_id=key.team_id, display_prefix=key.display_prefix,
                   name=key.name, user=key.user,
                   allowed_models=(None if key.allowed_models is None
                                   else list(key.allowed_models)),
                   limits=key.limits, expires_at=key.expires_at, revoked_at=key.revoked_at,
                   status=key.status(now or datetime.now(UTC)), revision=key.revision,
                   created_at=key.created_at)


def encode_cursor(last_id: str) -> str:
    """A page position: the last id shown, hex-encoded (opaque to clients)."""
    return last_id.encode().hex()


def decode_cursor(cursor: str | None) -> str | None:
    """The id a page starts after, or None. Any well-formed cursor (the route's pattern
    holds it to hex pairs) positions the page in id order; one this API did not make
    just starts somewhere in it."""
    if cursor is None:
        return None
    return bytes.fromhex(cursor).decode("utf-8", errors="replace")


def page(items: list[T], ids: list[str], *, after: str | None,
            limit: int) -> tuple[list[T], str | None]:
    """Items in id order after ``after``, at most ``limit``, and the next cursor."""
    ordered = sorted(zip(ids, items, strict=True), key=lambda pair: pair[0])
    rest = [(i, item) for i, item in ordered if after is None or i > after]
    chunk = rest[:limit]
    more = len(rest) > limit
    return [item for _, item in chunk], (encode_cursor(chunk[-1][0]) if more else None)


def found(value: T | None, missing: str) -> T:
    """``value``, or the 404 saying what is ``missing``."""
    if value is None:
        raise NotFound(missing)
    return value
