"""The local-profile key store: teams and keys in one SQLite file (single replica).

Keys are stored as their SHA-256 and a short display prefix, never as plaintext. Every
edit bumps the row's revision; revocation leaves a tombstone (``revoked_at``) so a
revoked key stays listed and can never be re-created with the same hash. The store is a
:class:`gateway.localdb.SqliteBase` (one connection, key resolution inline on the event
loop when the file is free); its tables and statements are ``sql/local/keys.sql``.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import sql
from gateway.errors import AlreadyExists, BadRequest, KeyRevoked, NotFound
from gateway.keys._derive import RotationSecrets, local_rotation_secrets
from gateway.keys._limits import (
    KEY_LIMITS,
    MEMBER_LIMITS,
    TEAM_LIMITS,
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
from gateway.localdb import MEMORY, SqliteBase, Statements

# Frozen structs, so one shared default instance is safe.
_NO_TEAM_LIMITS = TeamLimits()
_NO_KEY_LIMITS = KeyLimits()
_SQL = Statements(sql.local_keys)


def _ts(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise BadRequest("timestamps must be timezone-aware (UTC)")
    return value.astimezone(UTC).isoformat()


def _dt(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


_ROWS = Rows(at=_dt, listed=json.loads, key_user="user")
"""SQLite keeps times as ISO text and lists as JSON."""


def _budget(row: sqlite3.Row | None) -> MemberLimits | None:
    return None if row is None else MemberLimits(**{n: row[n] for n in MEMBER_LIMITS})


def _find_team(conn: sqlite3.Connection, name_or_id: str) -> sqlite3.Row | None:
    row: sqlite3.Row | None = _SQL["find_team"].execute(conn, {"name_or_id": name_or_id}).fetchone()
    return row


def _team_id(conn: sqlite3.Connection, team: str) -> str:
    row = _find_team(conn, team)
    if row is None:
        raise NotFound(f"team {team!r} does not exist")
    return str(row["id"])


def _get_team(conn: sqlite3.Connection, team_id: str) -> Team:
    return _ROWS.team(_SQL["team"].execute_values(conn, team_id).fetchone())


def _get_key(conn: sqlite3.Connection, key_id: str) -> Any:
    """The key's row (a :class:`sqlite3.Row`), or None."""
    return _SQL["key"].execute(conn, {"id": key_id}).fetchone()


class SqliteKeyStore(SqliteBase):
    """:class:`gateway.keys.KeyStore` on a SQLite file (the local profile)."""

    schema = sql.local_keys["schema"]

    def __init__(self, path: str, *,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 rotation_secrets: RotationSecrets | None = None) -> None:
        """``rotation_secrets``: what an Idempotency-Key rotation's secret is derived
        with (``server.rotation_secret_ref``); without it, the store's own secret in a
        file beside the database (gateway/keys/_derive.py)."""
        super().__init__(path)
        self._clock = clock
        self._rotation = rotation_secrets

    def _rotation_secrets(self) -> RotationSecrets:
        if self._rotation is None:
            self._rotation = (RotationSecrets(secrets.token_bytes(32)) if self.path == MEMORY
                              else local_rotation_secrets(self.path))
        return self._rotation

    async def resolve(self, key_hash: str) -> Principal | None:
        def _resolve(conn: sqlite3.Connection) -> Principal | None:
            now = self._clock()
            valid_until = None
            row = _SQL["key_by_hash"].execute_values(conn, key_hash).fetchone()
            if row is None:  # a secret a rotation replaced, within its grace?
                rotated = _SQL["rotated_key"].execute_values(conn, key_hash).fetchone()
                valid_until = None if rotated is None else _dt(rotated["old_valid_until"])
                if valid_until is None or valid_until <= now:
                    return None
                row = _get_key(conn, rotated["key_id"])
            key = _ROWS.key(row)
            if key.revoked_at is not None:
                return None
            if key.expires_at is not None and key.expires_at <= now:
                return None
            team = _get_team(conn, key.team_id)
            member = user = None
            if key.user is not None:
                member = _budget(_SQL["member_budget"].execute(conn, {
                    "team_id": key.team_id, "user_name": key.user}).fetchone())
                user = _budget(_SQL["user"].execute(conn, {"name": key.user}).fetchone())
            return Principal(key_id=key.id, key_prefix=key.display_prefix,
                             key_revision=key.revision, key_limits=key.limits,
                             allowed_models=key.allowed_models, team=team, user=key.user,
                             secret_valid_until=valid_until, member_limits=member,
                             user_limits=user)
        return await self._run(_resolve, write=False, inline=True)

    async def create_team(self, *, name: str, limits: TeamLimits = _NO_TEAM_LIMITS,
                          region: str | None = None,
                          guardrails: tuple[str, ...] = ()) -> Team:
        check_new_team(name, limits, guardrails)

        def _create(conn: sqlite3.Connection) -> Team:
            if _find_team(conn, name) is not None:
                raise AlreadyExists(f"team {name!r} already exists")
            team_id = "team_" + uuid.uuid4().hex[:16]
            _SQL["insert_team"].execute(conn, {
                "id": team_id, "name": name, **limit_columns(limits, TEAM_LIMITS),
                "region": region, "guardrails": json.dumps(list(guardrails)),
                "created_at": _ts(self._clock())})
            return _get_team(conn, team_id)
        return await self._run(_create)

    async def update_team(self, name_or_id: str, *, limits: TeamLimits | None = None,
                          guardrails: tuple[str, ...] | None = None,
                          expected_revision: int | None = None) -> Team:
        """Replace a team's limits and/or guardrail profiles (None keeps them), bumping
        its revision (compared in the transaction)."""
        check_team_edit(limits, guardrails)

        def _update(conn: sqlite3.Connection) -> Team:
            row = _find_team(conn, name_or_id)
            if row is None:
                raise NotFound(f"team {name_or_id!r} does not exist")
            check_revision(f"team {row['name']!r}", row["revision"], expected_revision)
            team = _ROWS.team(row)
            _SQL["update_team"].execute(conn, {
                "id": row["id"], **limit_columns(team.limits if limits is None else limits,
                                                 TEAM_LIMITS),
                "guardrails": json.dumps(list(team.guardrails if guardrails is None
                                              else guardrails))})
            return _get_team(conn, row["id"])
        return await self._run(_update)

    async def get_team(self, name_or_id: str) -> Team | None:
        def _get(conn: sqlite3.Connection) -> Team | None:
            row = _find_team(conn, name_or_id)
            return None if row is None else _ROWS.team(row)
        return await self._run(_get, write=False)

    async def list_teams(self) -> list[Team]:
        def _list(conn: sqlite3.Connection) -> list[Team]:
            return [_ROWS.team(r) for r in _SQL["teams"].execute(conn)]
        return await self._run(_list, write=False)

    async def create_key(self, *, team: str, name: str = "", user: str | None = None,
                         allowed_models: tuple[str, ...] | None = None,
                         limits: KeyLimits = _NO_KEY_LIMITS,
                         expires_at: datetime | None = None) -> tuple[str, KeyRecord]:
        check_new_key(limits, user)
        plaintext, key_hash, prefix = new_key()
        models = None if allowed_models is None else json.dumps(list(allowed_models))

        def _create(conn: sqlite3.Connection) -> KeyRecord:
            row = _find_team(conn, team)
            if row is None:
                raise NotFound(f"team {team!r} does not exist")
            key_id = "key_" + uuid.uuid4().hex[:16]
            _SQL["insert_key"].execute(conn, {
                "id": key_id, "team_id": row["id"], "key_hash": key_hash,
                "display_prefix": prefix, "name": name, "user": user,
                "allowed_models": models, **limit_columns(limits, KEY_LIMITS),
                "expires_at": _ts(expires_at), "created_at": _ts(self._clock())})
            return _ROWS.key(_get_key(conn, key_id))
        return plaintext, await self._run(_create)

    async def get_key(self, key_id: str) -> KeyRecord | None:
        def _get(conn: sqlite3.Connection) -> KeyRecord | None:
            row = _get_key(conn, key_id)
            return None if row is None else _ROWS.key(row)
        return await self._run(_get, write=False)

    async def list_keys(self, *, team: str | None = None,
                        include_revoked: bool = False) -> list[KeyRecord]:
        def _list(conn: sqlite3.Connection) -> list[KeyRecord]:
            team_id = None
            if team is not None:
                row = _find_team(conn, team)
                if row is None:
                    raise NotFound(f"team {team!r} does not exist")
                team_id = row["id"]
            return [_ROWS.key(r) for r in _SQL["keys"].execute(conn, {
                "team_id": team_id, "include_revoked": include_revoked})]
        return await self._run(_list, write=False)

    async def update_key(self, key_id: str, changes: KeyChanges, *,
                         expected_revision: int | None = None) -> KeyRecord:
        def _update(conn: sqlite3.Connection) -> KeyRecord:
            row = editable(f"key {key_id!r}", _get_key(conn, key_id), expected_revision)
            new = edited_key(_ROWS.key(row), changes)
            _SQL["update_key"].execute(conn, {
                "id": key_id, "name": new.name, "user": new.user,
                "allowed_models": (None if new.allowed_models is None
                                   else json.dumps(list(new.allowed_models))),
                "expires_at": _ts(new.expires_at), **limit_columns(new.limits, KEY_LIMITS)})
            return _ROWS.key(_get_key(conn, key_id))
        return await self._run(_update)

    async def rotate_key(self, key_id: str, *, grace_s: int,
                         idempotency_key: str | None = None,
                         expected_revision: int | None = None) -> Rotation:
        check_grace(grace_s)
        idem = None if idempotency_key is None else hash_key(idempotency_key)

        def _rotate(conn: sqlite3.Connection) -> Rotation:
            row = _get_key(conn, key_id)
            if row is None:
                raise NotFound(f"key {key_id!r} does not exist")
            if idempotency_key is not None:
                done = _SQL["key_rotation_by_idempotency"].execute(conn, {
                    "key_id": key_id, "idempotency_hash": idem}).fetchone()
                if done is not None:
                    secret = replayed_secret(self._rotation_secrets(), salt=done["salt"],
                                             idempotency_key=idempotency_key,
                                             new_key_hash=done["new_key_hash"])
                    return Rotation(secret=secret, key=_ROWS.key(row), replayed=True,
                                    previous_valid_until=datetime.fromisoformat(
                                        done["old_valid_until"]))
            check_revision(f"key {key_id!r}", row["revision"], expected_revision)
            if row["revoked_at"] is not None:
                raise KeyRevoked(f"key {key_id!r} is revoked; create a new key")
            secret, key_hash, prefix, salt = rotation_secret(
                idempotency_key, None if idempotency_key is None else self._rotation_secrets())
            now = self._clock()
            # At most two secrets work at once: the new one, and the one just replaced
            # for its grace; whatever earlier rotations left in their grace ends now.
            _SQL["end_replaced_secrets"].execute(conn, {"key_id": key_id, "now": _ts(now)})
            until = now + timedelta(seconds=grace_s)
            _SQL["rotate_key"].execute(conn, {"id": key_id, "key_hash": key_hash,
                                              "display_prefix": prefix})
            updated = _ROWS.key(_get_key(conn, key_id))
            _SQL["insert_key_rotation"].execute(conn, {
                "key_id": key_id, "revision": updated.revision,
                "old_key_hash": row["key_hash"], "old_valid_until": _ts(until),
                "new_key_hash": key_hash, "idempotency_hash": idem, "salt": salt,
                "created_at": _ts(now)})
            return Rotation(secret=secret, key=updated, previous_valid_until=until)
        return await self._run(_rotate)

    async def revoke_key(self, key_id: str, *,
                         expected_revision: int | None = None) -> KeyRecord:
        def _revoke(conn: sqlite3.Connection) -> KeyRecord:
            row = editable(f"key {key_id!r}", _get_key(conn, key_id), expected_revision)
            if row["revoked_at"] is None:
                _SQL["revoke_key"].execute(conn, {"id": key_id,
                                                  "revoked_at": _ts(self._clock())})
            return _ROWS.key(_get_key(conn, key_id))
        return await self._run(_revoke)

    async def sync_brokered(self, keys: list[tuple[Any, ...]],
                            denied: list[tuple[str, datetime]], *,
                            complete: bool) -> tuple[int, int]:
        """Hold the keys inferplaned sends a lease-profile plane (docs/identity.md,
        docs/inferplaned.md): each of ``keys`` (id, team name, user, key hash[, brokered,
        name]) of a team this store has is added when missing (a brokered credential's
        key, or a plain key made at inferplaned, ``user`` ``""`` for none), its hash
        replaced when it was rotated there; each of ``denied`` (id, revoked at) is revoked
        at its time and, when ``complete``, every other such key held is revoked now.
        Keys made on this plane are never touched. One write transaction; (keys added,
        keys revoked)."""
        def _sync(conn: sqlite3.Connection) -> tuple[int, int]:
            now = _ts(self._clock())
            held = {r["id"]: r for r in _SQL["brokered_keys"].execute(conn)}
            team_ids: dict[str, str | None] = {}
            added = revoked = 0
            for key_id, team, user, key_hash, *rest in keys:
                brokered, name = (rest + [True, "brokered credential"][len(rest):])[:2]
                if key_id in held:
                    if held[key_id]["key_hash"] != key_hash and not brokered:
                        _SQL["rehash_brokered_key"].execute(
                            conn, {"id": key_id, "key_hash": key_hash})
                    continue
                if team not in team_ids:
                    row = _find_team(conn, team)
                    team_ids[team] = None if row is None else str(row["id"])
                team_id = team_ids[team]
                if team_id is not None:
                    added += _SQL["insert_brokered_key"].execute(conn, {
                        "id": key_id, "team_id": team_id, "key_hash": key_hash,
                        "display_prefix": "brokered" if brokered else "inferplaned",
                        "name": name, "user": user or None, "created_at": now}).rowcount
            active, deny = {k[0] for k in keys}, dict(denied)
            for key_id, row in held.items():
                at = _ts(deny[key_id]) if key_id in deny else (
                    now if complete and key_id not in active else None)
                if row["revoked_at"] is None and at is not None:
                    _SQL["revoke_key"].execute(conn, {"id": key_id, "revoked_at": at})
                    revoked += 1
            return added, revoked
        return await self._run(_sync)

    # -- members and users -----------------------------------------------------------

    async def list_members(self, team: str) -> list[Member]:
        def _list(conn: sqlite3.Connection) -> list[Member]:
            team_id = _team_id(conn, team)
            return [_ROWS.member(r)
                    for r in _SQL["members"].execute(conn, {"team_id": team_id})]
        return await self._run(_list, write=False)

    async def team_members(self, team: str) -> TeamMembers:
        def _read(conn: sqlite3.Connection) -> TeamMembers:
            row = _find_team(conn, team)
            if row is None:
                raise NotFound(f"team {team!r} does not exist")
            found = _ROWS.team(row)
            members = [_ROWS.member(r)
                       for r in _SQL["members"].execute(conn, {"team_id": found.id})]
            keys = [_ROWS.key(r) for r in _SQL["keys"].execute(conn, {
                "team_id": found.id, "include_revoked": True})]
            return team_members_of(found, members, keys)
        return await self._run(_read, write=False)

    async def get_member(self, team: str, user: str) -> Member | None:
        def _get(conn: sqlite3.Connection) -> Member | None:
            row = _SQL["member"].execute(conn, {"team_id": _team_id(conn, team),
                                                "user_name": user}).fetchone()
            return None if row is None else _ROWS.member(row)
        return await self._run(_get, write=False)

    async def put_member(self, team: str, user: str, *, limits: MemberLimits,
                         expected_revision: int | None = None) -> Member:
        """One write transaction: the member's row and its team's revision move together
        (admission re-checks the team's revision in its own transaction)."""
        check_member(user, limits, default_allowed=True)

        def _put(conn: sqlite3.Connection) -> Member:
            team_id = _team_id(conn, team)
            where = {"team_id": team_id, "user_name": user}
            row = _SQL["member"].execute(conn, where).fetchone()
            check_revision(member_what(user, team), 0 if row is None else row["revision"],
                           expected_revision)
            _SQL["upsert_member"].execute(conn, {
                **where, **limit_columns(limits, MEMBER_LIMITS), "now": _ts(self._clock())})
            _SQL["bump_team"].execute(conn, {"id": team_id})
            return _ROWS.member(_SQL["member"].execute(conn, where).fetchone())
        return await self._run(_put)

    async def delete_member(self, team: str, user: str, *,
                            expected_revision: int | None = None) -> Member:
        def _delete(conn: sqlite3.Connection) -> Member:
            team_id = _team_id(conn, team)
            where = {"team_id": team_id, "user_name": user}
            row = _SQL["member"].execute(conn, where).fetchone()
            if row is None:
                raise NotFound(f"{member_what(user, team)} does not exist")
            check_revision(member_what(user, team), row["revision"], expected_revision)
            _SQL["delete_member"].execute(conn, where)
            _SQL["bump_team"].execute(conn, {"id": team_id})
            return _ROWS.member(row)
        return await self._run(_delete)

    async def list_users(self) -> list[User]:
        def _list(conn: sqlite3.Connection) -> list[User]:
            return [_ROWS.user(r) for r in _SQL["users"].execute(conn)]
        return await self._run(_list, write=False)

    async def get_user(self, name: str) -> User | None:
        def _get(conn: sqlite3.Connection) -> User | None:
            row = _SQL["user"].execute(conn, {"name": name}).fetchone()
            return None if row is None else _ROWS.user(row)
        return await self._run(_get, write=False)

    async def put_user(self, name: str, *, limits: MemberLimits, email: str | None = None,
                       display_name: str | None = None,
                       expected_revision: int | None = None) -> User:
        check_member(name, limits, default_allowed=False)

        def _put(conn: sqlite3.Connection) -> User:
            row = _SQL["user"].execute(conn, {"name": name}).fetchone()
            check_revision(f"user {name!r}", 0 if row is None else row["revision"],
                           expected_revision)
            _SQL["upsert_user"].execute(conn, {
                "name": name, "email": email, "display_name": display_name,
                **limit_columns(limits, MEMBER_LIMITS), "now": _ts(self._clock())})
            _SQL["bump_user_teams"].execute(conn, {"name": name})
            return _ROWS.user(_SQL["user"].execute(conn, {"name": name}).fetchone())
        return await self._run(_put)

    # -- console sessions (gateway/keys/_sessions.py) --------------------------------

    def _instant(self, delta_s: float = 0.0) -> str:
        """The clock (+ ``delta_s``) as fixed-width ISO text (ordered like the time)."""
        at = self._clock().astimezone(UTC) + timedelta(seconds=delta_s)
        return at.isoformat(timespec="microseconds")

    async def create_console_session(self, *, id_sha256: bytes, subject: str,
                                     access: SessionAccess, credential_sha256: bytes,
                                     max_age_s: float) -> None:
        def _create(conn: sqlite3.Connection) -> None:
            _SQL["purge_console_sessions"].execute(conn, {
                "before": self._instant(-PURGE_AFTER_S)})
            _SQL["insert_console_session"].execute(conn, {
                "id_sha256": id_sha256, "subject": subject, "access": access,
                "credential_sha256": credential_sha256, "now": self._instant(),
                "expires_at": self._instant(max_age_s)})
        await self._run(_create)

    async def console_session(self, id_sha256: bytes, *,
                              idle_s: float) -> ConsoleSession | None:
        def _touch(conn: sqlite3.Connection) -> ConsoleSession | None:
            row = _SQL["console_session"].execute(conn, {
                "id_sha256": id_sha256, "now": self._instant(),
                "idle_since": self._instant(-idle_s)}).fetchone()
            if row is None:
                return None
            return ConsoleSession(subject=row["subject"], access=row["access"],
                                  credential_sha256=bytes(row["credential_sha256"]),
                                  created_at=datetime.fromisoformat(row["created_at"]),
                                  expires_at=datetime.fromisoformat(row["expires_at"]))
        return await self._run(_touch)

    async def end_console_session(self, id_sha256: bytes) -> None:
        def _end(conn: sqlite3.Connection) -> None:
            _SQL["end_console_session"].execute(conn, {"id_sha256": id_sha256,
                                                       "now": self._instant()})
        await self._run(_end)

    async def end_console_sessions(self, credential_sha256: bytes) -> int:
        def _end(conn: sqlite3.Connection) -> int:
            return _SQL["end_console_sessions"].execute(conn, {
                "credential_sha256": credential_sha256, "now": self._instant()}).rowcount
        return await self._run(_end)
