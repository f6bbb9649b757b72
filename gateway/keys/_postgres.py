"""The shared-profile key store: teams and keys in Postgres (ADR-046 "Shared identity").

Every replica reads the same rows, so a key revoked through one gateway is refused by
the next admission on any other (admission re-checks the revision the Principal was
resolved at, inside the admission transaction). Keys are stored as SHA-256 hashes with a
display prefix; revocation is a tombstone. Edits lock the row ``FOR UPDATE`` and compare
``expected_revision`` in the same transaction; admission holds the row ``FOR SHARE``, so
an edit serialises against in-flight admissions and never interleaves with one.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec
from psycopg import AsyncConnection
from psycopg.errors import UniqueViolation

import sql
from gateway.config import BootstrapTeam
from gateway.db import Pool, connection, fetch_all, fetch_one
from gateway.errors import AlreadyExists, BadRequest, ConfigError, KeyRevoked, NotFound
from gateway.keys._derive import RotationSecrets
from gateway.keys._limits import (
    KEY_LIMITS,
    MEMBER_LIMITS,
    TEAM_LIMITS,
    check_limits,
    check_member,
    check_new_key,
    check_new_team,
    check_revision,
    check_team_edit,
    editable,
    edited_key,
    member_what,
)
from gateway.keys._members import TeamMembers, team_members_of
from gateway.keys._model import (
    KeyChanges,
    KeyLimits,
    KeyRecord,
    Member,
    MemberLimits,
    Principal,
    Rotation,
    Team,
    TeamLimits,
    User,
    check_grace,
    hash_key,
    new_key,
    replayed_secret,
    rotation_secret,
)
from gateway.keys._rows import Rows, limit_columns
from gateway.keys._sessions import PURGE_AFTER_S, ConsoleSession, SessionAccess

_NO_TEAM_LIMITS = TeamLimits()
_NO_KEY_LIMITS = KeyLimits()


def _as_is(value: Any) -> Any:
    return value


ROWS = Rows(at=_as_is, listed=lambda items: items or (), key_user="user_name")
"""Postgres hands back times and arrays as Python values already."""


def _budget(row: dict[str, Any], present: str, prefix: str) -> MemberLimits | None:
    if row[present] is None:
        return None
    return MemberLimits(tokens_per_day=row[f"{prefix}_tokens_day"],
                        usd_micros_per_day=row[f"{prefix}_usd_day"],
                        usd_micros_per_month=row[f"{prefix}_usd_month"])


def _principal(row: dict[str, Any]) -> Principal:
    team = Team(id=row["team_id"], name=row["team_name"],
                limits=TeamLimits(**{n: row[n] for n in TEAM_LIMITS}),
                revision=row["team_revision"], region=row["region"],
                guardrails=tuple(row["guardrails"] or ()), created_at=row["team_created_at"])
    models = row["allowed_models"]
    return Principal(
        key_id=row["key_id"], key_prefix=row["display_prefix"],
        key_revision=row["key_revision"],
        key_limits=KeyLimits(rpm=row["key_rpm"], tpm=row["key_tpm"],
                             usd_micros_per_day=row["key_usd_day"],
                             usd_micros_per_month=row["key_usd_month"]),
        allowed_models=None if models is None else tuple(models), team=team,
        user=row["user_name"], secret_valid_until=row["secret_valid_until"],
        member_limits=_budget(row, "member_user", "member"),
        user_limits=_budget(row, "user_row", "user"))


async def _one(conn: AsyncConnection[Any], query: str, **params: Any) -> dict[str, Any] | None:
    return await fetch_one(conn, sql.queries[query], params)


class PostgresKeyStore:
    """:class:`gateway.keys.KeyStore` on the shared Postgres database."""

    def __init__(self, pool: Pool, *, rotation_secrets: RotationSecrets | None = None) -> None:
        """``rotation_secrets``: what an Idempotency-Key rotation's secret is derived
        with (``server.rotation_secret_ref``); without it such a rotation is refused."""
        self._pool = pool
        self._rotation = rotation_secrets

    async def resolve(self, key_hash: str) -> Principal | None:
        # One statement reads key and team from one MVCC snapshot (what a read-only
        # repeatable-read transaction would give) in a single round trip; expiry is
        # compared with database time, not this replica's clock.
        async with connection(self._pool, "key store") as conn:
            row = await _one(conn, "resolve_key", key_hash=key_hash)
        return None if row is None else _principal(row)

    async def create_team(self, *, name: str, limits: TeamLimits = _NO_TEAM_LIMITS,
                          region: str | None = None,
                          guardrails: tuple[str, ...] = ()) -> Team:
        check_new_team(name, limits, guardrails)
        async with connection(self._pool, "key store") as conn, \
                conn.transaction():
            if await _one(conn, "find_team", name_or_id=name) is not None:
                raise AlreadyExists(f"team {name!r} already exists")
            try:
                row = await _one(conn, "insert_team", id="team_" + uuid.uuid4().hex[:16],
                                 name=name, region=region, guardrails=list(guardrails),
                                 **limit_columns(limits, TEAM_LIMITS))
            except UniqueViolation:  # created meanwhile by another replica
                raise AlreadyExists(f"team {name!r} already exists") from None
        assert row is not None
        return ROWS.team(row)

    async def update_team(self, name_or_id: str, *, limits: TeamLimits | None = None,
                          guardrails: tuple[str, ...] | None = None,
                          expected_revision: int | None = None) -> Team:
        """Replace a team's limits and/or guardrail profiles (None keeps them), bumping
        its revision (compared in the transaction)."""
        check_team_edit(limits, guardrails)
        async with connection(self._pool, "key store") as conn, \
                conn.transaction():
            row = await _one(conn, "find_team_for_update", name_or_id=name_or_id)
            if row is None:
                raise NotFound(f"team {name_or_id!r} does not exist")
            check_revision(f"team {row['name']!r}", row["revision"], expected_revision)
            team = ROWS.team(row)
            kept = team.limits if limits is None else limits
            row = await _one(conn, "update_team", id=row["id"],
                             guardrails=list(team.guardrails if guardrails is None
                                             else guardrails),
                             **limit_columns(kept, TEAM_LIMITS))
        assert row is not None
        return ROWS.team(row)

    async def get_team(self, name_or_id: str) -> Team | None:
        async with connection(self._pool, "key store") as conn:
            row = await _one(conn, "find_team", name_or_id=name_or_id)
        return None if row is None else ROWS.team(row)

    async def list_teams(self) -> list[Team]:
        async with connection(self._pool, "key store") as conn:
            rows = await fetch_all(conn, sql.queries["list_teams"])
        return [ROWS.team(r) for r in rows]

    async def create_key(self, *, team: str, name: str = "", user: str | None = None,
                         allowed_models: tuple[str, ...] | None = None,
                         limits: KeyLimits = _NO_KEY_LIMITS,
                         expires_at: datetime | None = None) -> tuple[str, KeyRecord]:
        check_new_key(limits, user)
        if expires_at is not None and expires_at.tzinfo is None:
            raise BadRequest("key expires_at: must be timezone-aware (UTC)")
        plaintext, key_hash, prefix = new_key()
        async with connection(self._pool, "key store") as conn, \
                conn.transaction():
            team_row = await _one(conn, "find_team", name_or_id=team)
            if team_row is None:
                raise NotFound(f"team {team!r} does not exist")
            row = await _one(
                conn, "insert_key", id="key_" + uuid.uuid4().hex[:16],
                team_id=team_row["id"], key_hash=key_hash, display_prefix=prefix,
                name=name, user_name=user,
                allowed_models=None if allowed_models is None else list(allowed_models),
                expires_at=expires_at, **limit_columns(limits, KEY_LIMITS))
        assert row is not None
        return plaintext, ROWS.key(row)

    async def get_key(self, key_id: str) -> KeyRecord | None:
        async with connection(self._pool, "key store") as conn:
            row = await _one(conn, "get_key", id=key_id)
        return None if row is None else ROWS.key(row)

    async def list_keys(self, *, team: str | None = None,
                        include_revoked: bool = False) -> list[KeyRecord]:
        async with connection(self._pool, "key store") as conn:
            team_id = None
            if team is not None:
                team_row = await _one(conn, "find_team", name_or_id=team)
                if team_row is None:
                    raise NotFound(f"team {team!r} does not exist")
                team_id = team_row["id"]
            rows = await fetch_all(conn, sql.queries["list_keys"],
                                   {"team_id": team_id, "include_revoked": include_revoked})
        return [ROWS.key(r) for r in rows]

    async def revoke_key(self, key_id: str, *,
                         expected_revision: int | None = None) -> KeyRecord:
        """Tombstone a key; FOR UPDATE waits out admissions holding it FOR SHARE."""
        async with connection(self._pool, "key store") as conn, \
                conn.transaction():
            row = editable(f"key {key_id!r}", await _one(conn, "get_key_for_update", id=key_id),
                           expected_revision)
            if row["revoked_at"] is None:
                row = await _one(conn, "revoke_key", id=key_id)
        assert row is not None
        return ROWS.key(row)

    async def update_key(self, key_id: str, changes: KeyChanges, *,
                         expected_revision: int | None = None) -> KeyRecord:
        """FOR UPDATE waits out admissions holding the key FOR SHARE; the next admission
        sees the new revision (a Principal read before is re-read, DESIGN §4)."""
        async with connection(self._pool, "key store") as conn, \
                conn.transaction():
            row = editable(f"key {key_id!r}", await _one(conn, "get_key_for_update", id=key_id),
                           expected_revision)
            new = edited_key(ROWS.key(row), changes)
            row = await _one(conn, "update_key", id=key_id, name=new.name,
                             user_name=new.user,
                             allowed_models=(None if new.allowed_models is None
                                             else list(new.allowed_models)),
                             expires_at=new.expires_at,
                             **limit_columns(new.limits, KEY_LIMITS))
        assert row is not None
        return ROWS.key(row)

    async def rotate_key(self, key_id: str, *, grace_s: int,
                         idempotency_key: str | None = None,
                         expected_revision: int | None = None) -> Rotation:
        """FOR UPDATE on the key row serialises rotations (and their retries) of one key
        across replicas, and waits out admissions holding it FOR SHARE."""
        check_grace(grace_s)
        idem = None if idempotency_key is None else hash_key(idempotency_key)
        async with connection(self._pool, "key store") as conn, \
                conn.transaction():
            row = await _one(conn, "get_key_for_update", id=key_id)
            if row is None:
                raise NotFound(f"key {key_id!r} does not exist")
            if idempotency_key is not None:
                done = await _one(conn, "key_rotation_by_idempotency", key_id=key_id,
                                  idempotency_hash=idem)
                if done is not None:
                    secret = replayed_secret(self._rotation, salt=done["salt"],
                                             idempotency_key=idempotency_key,
                                             new_key_hash=done["new_key_hash"])
                    return Rotation(secret=secret, key=ROWS.key(row), replayed=True,
                                    previous_valid_until=done["old_valid_until"])
            check_revision(f"key {key_id!r}", row["revision"], expected_revision)
            if row["revoked_at"] is not None:
                raise KeyRevoked(f"key {key_id!r} is revoked; create a new key")
            secret, key_hash, prefix, salt = rotation_secret(idempotency_key, self._rotation)
            updated = await _one(conn, "rotate_key", id=key_id, key_hash=key_hash,
                                 display_prefix=prefix)
            assert updated is not None
            # At most two secrets work at once: the new one, and the one just replaced
            # for its grace; whatever earlier rotations left in their grace ends now.
            await conn.execute(sql.queries["end_replaced_secrets"], {"key_id": key_id})
            rotation = await _one(conn, "insert_key_rotation", key_id=key_id,
                                  revision=updated["revision"], old_key_hash=row["key_hash"],
                                  grace_s=grace_s, new_key_hash=key_hash,
                                  idempotency_hash=idem, salt=salt)
        assert rotation is not None
        return Rotation(secret=secret, key=ROWS.key(updated),
                        previous_valid_until=rotation["old_valid_until"])

    # -- members and users -----------------------------------------------------------

    async def _team_id(self, conn: AsyncConnection[Any], team: str, *,
                       lock: bool = False) -> str:
        row = await _one(conn, "find_team_for_update" if lock else "find_team",
                         name_or_id=team)
        if row is None:
            raise NotFound(f"team {team!r} does not exist")
        return str(row["id"])

    async def list_members(self, team: str) -> list[Member]:
        async with connection(self._pool, "key store") as conn:
            team_id = await self._team_id(conn, team)
            rows = await fetch_all(conn, sql.queries["list_members"], {"team_id": team_id})
        return [ROWS.member(r) for r in rows]

    async def team_members(self, team: str) -> TeamMembers:
        """The team, its member rows and its keys, read on one pooled connection."""
        async with connection(self._pool, "key store") as conn:
            row = await _one(conn, "find_team", name_or_id=team)
            if row is None:
                raise NotFound(f"team {team!r} does not exist")
            found = ROWS.team(row)
            members = await fetch_all(conn, sql.queries["list_members"], {"team_id": found.id})
            keys = await fetch_all(conn, sql.queries["list_keys"],
                                   {"team_id": found.id, "include_revoked": True})
        return team_members_of(found, [ROWS.member(r) for r in members],
                               [ROWS.key(r) for r in keys])

    async def get_member(self, team: str, user: str) -> Member | None:
        async with connection(self._pool, "key store") as conn:
            team_id = await self._team_id(conn, team)
            row = await _one(conn, "find_member", team_id=team_id, user_name=user)
        return None if row is None else ROWS.member(row)

    async def put_member(self, team: str, user: str, *, limits: MemberLimits,
                         expected_revision: int | None = None) -> Member:
        """The team row FOR UPDATE waits out admissions holding it FOR SHARE; its
        revision moves with the member's, so none is planned with the old budget."""
        check_member(user, limits, default_allowed=True)
        async with connection(self._pool, "key store") as conn, conn.transaction():
            team_id = await self._team_id(conn, team, lock=True)
            row = await _one(conn, "find_member_for_update", team_id=team_id,
                             user_name=user)
            check_revision(member_what(user, team), 0 if row is None else row["revision"],
                           expected_revision)
            row = await _one(conn, "upsert_member", team_id=team_id, user_name=user,
                             **limit_columns(limits, MEMBER_LIMITS))
        assert row is not None
        return ROWS.member(row)

    async def delete_member(self, team: str, user: str, *,
                            expected_revision: int | None = None) -> Member:
        async with connection(self._pool, "key store") as conn, conn.transaction():
            team_id = await self._team_id(conn, team, lock=True)
            row = await _one(conn, "find_member_for_update", team_id=team_id,
                             user_name=user)
            if row is None:
                raise NotFound(f"{member_what(user, team)} does not exist")
            check_revision(member_what(user, team), row["revision"], expected_revision)
            row = await _one(conn, "delete_member", team_id=team_id, user_name=user)
        assert row is not None
        return ROWS.member(row)

    async def list_users(self) -> list[User]:
        async with connection(self._pool, "key store") as conn:
            rows = await fetch_all(conn, sql.queries["list_users"])
        return [ROWS.user(r) for r in rows]

    async def get_user(self, name: str) -> User | None:
        async with connection(self._pool, "key store") as conn:
            row = await _one(conn, "find_user", name=name)
        return None if row is None else ROWS.user(row)

    async def put_user(self, name: str, *, limits: MemberLimits, email: str | None = None,
                       display_name: str | None = None,
                       expected_revision: int | None = None) -> User:
        """The teams the user holds keys in are locked FOR UPDATE (id order) and their
        revisions moved, like a member edit moves its team's."""
        check_member(name, limits, default_allowed=False)
        async with connection(self._pool, "key store") as conn, conn.transaction():
            row = await _one(conn, "find_user_for_update", name=name)
            check_revision(f"user {name!r}", 0 if row is None else row["revision"],
                           expected_revision)
            await fetch_all(conn, sql.queries["lock_user_teams"], {"name": name})
            row = await _one(conn, "upsert_user", name=name, email=email,
                             display_name=display_name,
                             **limit_columns(limits, MEMBER_LIMITS))
        assert row is not None
        return ROWS.user(row)

    async def declare_teams(self, declared: Sequence[BootstrapTeam]) -> list[str]:
        """Register config-declared teams by immutable fingerprint (ADR-046 bootstrap).

        The first replica to declare a team creates it (unless it already exists) and
        records the declaration's fingerprint. Repeating an identical declaration changes
        nothing — it never overwrites a later admin edit. A different declaration for the
        same team refuses startup, naming the config key. Returns the names created.
        """
        created = []
        for i, decl in enumerate(declared):
            fields = msgspec.structs.asdict(decl)
            name = fields.pop("name")
            body = json.dumps(fields, sort_keys=True, separators=(",", ":"))
            digest = hashlib.sha256(body.encode()).hexdigest()
            where = {"kind": "team", "name": name, "fingerprint": digest}
            async with connection(self._pool, "key store") as conn, conn.transaction():
                if await _one(conn, "declare", **where) is None:
                    first = await _one(conn, "declaration_for_update", **where)
                    if first is not None and first["fingerprint"] != digest:
                        raise ConfigError(
                            f"bootstrap_teams[{i}]: team {name!r} was first declared with "
                            "other limits; a declaration is immutable once registered "
                            "(edit the team with `mayu teams set` and restore the original "
                            "declaration)")
                    continue
                if await _one(conn, "find_team", name_or_id=name) is not None:
                    continue
                limits = TeamLimits(**fields)
                check_limits(limits, TEAM_LIMITS, f"bootstrap_teams[{i}]")
                await _one(conn, "insert_team", id="team_" + uuid.uuid4().hex[:16], name=name,
                           region=None, guardrails=[],
                           **limit_columns(limits, TEAM_LIMITS))
                created.append(name)
        return created

    # -- console sessions (gateway/keys/_sessions.py) --------------------------------

    async def create_console_session(self, *, id_sha256: bytes, subject: str,
                                     access: SessionAccess, credential_sha256: bytes,
                                     max_age_s: float) -> None:
        async with connection(self._pool, "key store") as conn:
            await conn.execute(sql.queries["purge_console_sessions"],
                               {"after_s": PURGE_AFTER_S})
            await conn.execute(sql.queries["insert_console_session"], {
                "id_sha256": id_sha256, "subject": subject, "access": access,
                "credential_sha256": credential_sha256, "max_age_s": max_age_s})

    async def console_session(self, id_sha256: bytes, *,
                              idle_s: float) -> ConsoleSession | None:
        async with connection(self._pool, "key store") as conn:
            row = await _one(conn, "console_session", id_sha256=id_sha256, idle_s=idle_s)
        if row is None:
            return None
        return ConsoleSession(subject=row["subject"], access=row["access"],
                              credential_sha256=bytes(row["credential_sha256"]),
                              created_at=row["created_at"], expires_at=row["expires_at"])

    async def end_console_session(self, id_sha256: bytes) -> None:
        async with connection(self._pool, "key store") as conn:
            await conn.execute(sql.queries["end_console_session"], {"id_sha256": id_sha256})

    async def end_console_sessions(self, credential_sha256: bytes) -> int:
        async with connection(self._pool, "key store") as conn:
            done = await conn.execute(sql.queries["end_console_sessions"],
                                      {"credential_sha256": credential_sha256})
        return done.rowcount

    async def close(self) -> None:
        """The pool belongs to the app lifespan, which closes it."""
        return None
