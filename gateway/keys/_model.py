"""Who is calling: keys, teams and the Principal a request is admitted as.

A :class:`Principal` is the immutable result of authenticating one request. It carries
the key and team *revisions* it was read at; admission re-checks them inside the
admission transaction, so an edit or a revoke between authentication and dispatch can
never widen a request (ADR-046). It is never serialized to clients.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from typing import Annotated, Protocol

import msgspec

from gateway.ceilings import MAX_AMOUNT, MAX_BUCKET_CAPACITY

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


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """The authenticated caller of one request (key → team → user)."""

    key_id: str
    key_prefix: str
    key_revision: int
    key_limits: KeyLimits
    allowed_models: tuple[str, ...] | None
    team: Team
    user: str | None = None

    @property
    def team_id(self) -> str:
        return self.team.id

    def may_use(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def new_key() -> tuple[str, str, str]:
    """A fresh random key: ``(plaintext, sha256 hex, display prefix)``."""
    plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
    return plaintext, hash_key(plaintext), plaintext[: len(KEY_PREFIX) + 6]


class KeyStore(Protocol):
    """Where keys and teams live (SQLite in the local profile, Postgres when shared)."""

    async def resolve(self, key_hash: str) -> Principal | None:
        """The Principal for a key hash, or None if unknown, revoked or expired."""

    async def create_team(self, *, name: str, limits: TeamLimits) -> Team: ...

    async def get_team(self, name_or_id: str) -> Team | None: ...

    async def list_teams(self) -> list[Team]: ...

    async def update_team(self, name_or_id: str, *, limits: TeamLimits,
                          expected_revision: int | None = None) -> Team:
        """Replace a team's limits (comparing the revision in the write transaction)."""

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

    async def close(self) -> None: ...
