"""Who is calling: keys, teams and the Principal a request is admitted as.

A :class:`Principal` is the immutable result of authenticating one request. It carries
the key and team *revisions* it was read at; admission re-checks them inside the
admission transaction, so an edit or a revoke between authentication and dispatch can
never widen a request (ADR-046). It is never serialized to clients.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Literal, Protocol

import msgspec

from gateway.ceilings import MAX_AMOUNT, MAX_BUCKET_CAPACITY
from gateway.errors import BadRequest
from gateway.keys._derive import RotationSecrets, no_rotation_secret

if TYPE_CHECKING:  # built on this module's types
    from gateway.keys._members import TeamMembers

KEY_PREFIX = "sk-inf-"

Rate = Annotated[int, msgspec.Meta(ge=1, le=MAX_BUCKET_CAPACITY)]
"""Requests or tokens per minute (what a bucket can hold)."""
Amount = Annotated[int, msgspec.Meta(ge=0, le=MAX_AMOUNT)]
"""Tokens or µUSD a window can count exactly."""


class TeamLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-team limits; ``None`` means no cap on that dimension."""

    rpm: Rate | None = None
    tpm: Rate | None = None
    tokens_per_day: Amount | None = None
    usd_micros_per_day: Amount | None = None
    usd_micros_per_month: Amount | None = None
    budget_fit_floor: Amount | None = None
    """Budget fit (opt-in): a request whose worst case does not fit the team's remaining
    money or token quota is admitted with ``max_tokens`` lowered to the largest value that
    fits, if that is at least this many tokens. None: such requests are refused."""


class KeyLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-key limits; ``None`` means no cap on that dimension."""

    rpm: Rate | None = None
    tpm: Rate | None = None
    usd_micros_per_day: Amount | None = None
    usd_micros_per_month: Amount | None = None


class MemberLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A user's own budget: within one team (a member's) or across every team (a user's).
    ``None`` means no cap on that dimension."""

    tokens_per_day: Amount | None = None
    usd_micros_per_day: Amount | None = None
    usd_micros_per_month: Amount | None = None

    @property
    def empty(self) -> bool:
        return (self.tokens_per_day is None and self.usd_micros_per_day is None
                and self.usd_micros_per_month is None)


DEFAULT_MEMBER = "*"
"""The user name under which a team keeps its default member budget: the budget of every
user of the team that has no member row of its own."""


class Member(msgspec.Struct, frozen=True, kw_only=True):
    """A user's budget within one team (``user == DEFAULT_MEMBER``: the team's default)."""

    team_id: str
    user: str
    limits: MemberLimits = MemberLimits()
    revision: int = 1
    created_at: datetime | None = None
    updated_at: datetime | None = None


class User(msgspec.Struct, frozen=True, kw_only=True):
    """A person (the ``user`` of their keys), with a budget across every team."""

    name: str
    email: str | None = None
    display_name: str | None = None
    limits: MemberLimits = MemberLimits()
    revision: int = 1
    created_at: datetime | None = None
    updated_at: datetime | None = None


class Team(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    limits: TeamLimits = TeamLimits()
    revision: int = 1
    region: str | None = None
    guardrails: tuple[str, ...] = ()
    created_at: datetime | None = None


class KeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A stored key: never the plaintext, only its SHA-256 and a display prefix."""

    id: str
    team_id: str
    key_hash: str
    display_prefix: str
    name: str = ""
    user: str | None = None
    allowed_models: tuple[str, ...] | None = None
    limits: KeyLimits = KeyLimits()
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    revision: int = 1
    created_at: datetime | None = None

    def status(self, now: datetime) -> Literal["active", "revoked", "expired"]:
        """Whether the key authenticates at ``now`` (a revoked key also when expired)."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """The authenticated caller of one request (key → team → user)."""

    key_id: str
    key_prefix: str
    key_revision: int
    key_limits: KeyLimits
    allowed_models: tuple[str, ...] | None
    team: Team
    user: str | None = None
    member_limits: MemberLimits | None = None
    """The user's budget within this team: its member row, else the team's default member
    budget; None when the key has no user or neither exists."""
    user_limits: MemberLimits | None = None
    """The user's budget across every team (its user row); None without one."""
    secret_valid_until: datetime | None = None
    """Set when the presented secret is one a rotation replaced: it authenticates the key
    until then (its grace), and a Principal cached past it is resolved again."""

    @property
    def team_id(self) -> str:
        return self.team.id

    def may_use(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def new_key() -> tuple[str, str, str]:
    """A fresh random key: ``(plaintext, sha256 hex, display prefix)``."""
    return _key_triple(KEY_PREFIX + secrets.token_urlsafe(32))


def _key_triple(plaintext: str) -> tuple[str, str, str]:
    return plaintext, hash_key(plaintext), plaintext[: len(KEY_PREFIX) + 6]


class KeyChanges(msgspec.Struct, frozen=True, kw_only=True):
    """An edit of a key: each field given replaces the key's (``limits`` as a whole);
    a field left UNSET keeps it. The secret, team and id never change here."""

    name: str | msgspec.UnsetType = msgspec.UNSET
    user: str | None | msgspec.UnsetType = msgspec.UNSET
    allowed_models: tuple[str, ...] | None | msgspec.UnsetType = msgspec.UNSET
    limits: KeyLimits | msgspec.UnsetType = msgspec.UNSET
    expires_at: datetime | None | msgspec.UnsetType = msgspec.UNSET

    def applied(self, key: KeyRecord) -> KeyRecord:
        """``key`` with these changes (its revision untouched: the store bumps it)."""
        given = {f: v for f in self.__struct_fields__
                 if (v := getattr(self, f)) is not msgspec.UNSET}
        return msgspec.structs.replace(key, **given)


MAX_GRACE_S = 30 * 86400
"""The longest a replaced secret may keep working after a rotation."""


class Rotation(msgspec.Struct, frozen=True, kw_only=True):
    """A key's new secret, shown once (and again to a retry with the same
    Idempotency-Key), and until when the secret it replaced still works."""

    secret: str
    key: KeyRecord
    previous_valid_until: datetime
    replayed: bool = False
    """A retry of an earlier rotation of this key with the same Idempotency-Key."""


def rotation_secret(idempotency_key: str | None, derivation: RotationSecrets | None,
                    ) -> tuple[str, str, str, str | None]:
    """A rotation's new secret as ``new_key`` gives it, plus its salt: random without an
    Idempotency-Key; with one, derived from a random salt and the Idempotency-Key with the
    rotation secret (gateway/keys/_derive.py), so a retry carrying the same
    Idempotency-Key re-derives it (:func:`replayed_secret`) while the stored salt and
    hash alone cannot."""
    if idempotency_key is None:
        return (*new_key(), None)
    if derivation is None:
        raise no_rotation_secret()
    salt = secrets.token_hex(32)
    return (*_key_triple(_as_key(derivation.derive(salt, idempotency_key))), salt)


def replayed_secret(derivation: RotationSecrets | None, *, salt: str,
                    idempotency_key: str, new_key_hash: str) -> str:
    """The secret an earlier rotation with this Idempotency-Key answered (checked against
    its stored SHA-256)."""
    if derivation is None:
        raise no_rotation_secret()
    return _as_key(derivation.replay(
        salt, idempotency_key, matches=lambda d: hash_key(_as_key(d)) == new_key_hash))


def _as_key(digest: bytes) -> str:
    return KEY_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def check_grace(grace_s: int) -> None:
    if isinstance(grace_s, bool) or not isinstance(grace_s, int) \
            or not 0 <= grace_s <= MAX_GRACE_S:
        raise BadRequest(f"grace_seconds: must be an integer in 0..{MAX_GRACE_S} "
                         "(30 days)", param="grace_seconds")


class KeyStore(Protocol):
    """Where keys and teams live (SQLite in the local profile, Postgres when shared)."""

    async def resolve(self, key_hash: str) -> Principal | None:
        """The Principal for a key hash, or None if unknown, revoked or expired."""

    async def create_team(self, *, name: str, limits: TeamLimits,
                          guardrails: tuple[str, ...] = ()) -> Team: ...

    async def get_team(self, name_or_id: str) -> Team | None: ...

    async def list_teams(self) -> list[Team]: ...

    async def update_team(self, name_or_id: str, *, limits: TeamLimits | None = None,
                          guardrails: tuple[str, ...] | None = None,
                          expected_revision: int | None = None) -> Team:
        """Replace a team's limits and/or its guardrail profiles (None keeps them),
        comparing the revision in the write transaction; the revision moves, so every
        replica's next admission resolves the team's keys afresh."""

    async def get_key(self, key_id: str) -> KeyRecord | None: ...

    async def create_key(self, *, team: str, name: str = "", user: str | None = None,
                         allowed_models: tuple[str, ...] | None = None,
                         limits: KeyLimits = KeyLimits(),
                         expires_at: datetime | None = None) -> tuple[str, KeyRecord]:
        """Create a key; returns ``(plaintext, record)``. The plaintext is shown once."""

    async def list_keys(self, *, team: str | None = None,
                        include_revoked: bool = False) -> list[KeyRecord]: ...

    async def revoke_key(self, key_id: str, *, expected_revision: int | None = None) -> KeyRecord:
        """Tombstone a key (comparing the revision in the write transaction if given)."""

    async def update_key(self, key_id: str, changes: KeyChanges, *,
                         expected_revision: int | None = None) -> KeyRecord:
        """Apply ``changes`` (revision + 1, compared in the write transaction if
        ``expected_revision`` is given); a revoked key is refused (KeyRevoked)."""

    async def rotate_key(self, key_id: str, *, grace_s: int,
                         idempotency_key: str | None = None,
                         expected_revision: int | None = None) -> Rotation:
        """A new secret for the key (same id, limits and spend; revision + 1); the old one
        keeps working ``grace_s`` seconds. A retry with the same ``idempotency_key``
        answers the first rotation's secret (before any revision check)."""

    async def list_members(self, team: str) -> list[Member]:
        """A team's member budgets (its default, ``*``, among them)."""

    async def team_members(self, team: str) -> TeamMembers:
        """Every user of the team (a member budget, or one of its keys, revoked ones too)
        with the budget that binds them, and its default member budget
        (:func:`gateway.keys._members.team_members_of`); NotFound for no such team."""

    async def get_member(self, team: str, user: str) -> Member | None: ...

    async def put_member(self, team: str, user: str, *, limits: MemberLimits,
                         expected_revision: int | None = None) -> Member:
        """Create or replace a member's budget (``user`` ``*``: the team's default); the
        team's revision moves too, so every admission planned with the old budget is
        re-planned. ``expected_revision`` 0: only if it does not exist yet."""

    async def delete_member(self, team: str, user: str, *,
                            expected_revision: int | None = None) -> Member:
        """Remove a member's budget (the team's default applies again)."""

    async def list_users(self) -> list[User]: ...

    async def get_user(self, name: str) -> User | None: ...

    async def put_user(self, name: str, *, limits: MemberLimits, email: str | None = None,
                       display_name: str | None = None,
                       expected_revision: int | None = None) -> User:
        """Create or replace a user and its budget across teams; the revision of every
        team the user holds a key in moves too."""

    async def close(self) -> None: ...
