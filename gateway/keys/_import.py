"""Import a local-profile SQLite key store into the shared Postgres one (ADR-046, §7).

Copies teams and keys verbatim — ids, SHA-256 hashes, display prefixes, limits,
revisions, timestamps and revocation tombstones — and the users' and members' budgets
(limits, email, name, revisions) in ONE destination transaction. It
reads every stored record including revoked keys (``include_revoked=True``), and never
sees or makes a plaintext. A row that already exists identically is skipped, so an
identical retry is a no-op; any difference (same id with other values, or another row
holding the same name or hash) is a conflict and rolls the whole import back.

Operators must stop the old local writer before importing, or keys created after the
import would be missed. ``mayu keys import`` also moves the open month's spend in the
same transaction (:mod:`gateway.governance._import`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
from psycopg import AsyncConnection

import sql
from gateway.db import Pool, connection, fetch_one
from gateway.errors import InferplaneError, NotFound
from gateway.keys._limits import check_user_name
from gateway.keys._model import KeyRecord, Member, Team, User
from gateway.keys._postgres import ROWS
from gateway.keys._sqlite import SqliteKeyStore


class ImportConflict(InferplaneError):
    """The destination holds different data for an imported row; nothing was imported."""

    status = 409
    code = "import_conflict"


class ImportReport(msgspec.Struct, frozen=True, kw_only=True):
    teams_added: int
    teams_unchanged: int
    keys_added: int
    keys_unchanged: int
    users_added: int = 0
    users_unchanged: int = 0
    members_added: int = 0
    members_unchanged: int = 0


class People(msgspec.Struct, frozen=True, kw_only=True):
    """A local store's users and member budgets (the team's default among them)."""

    users: list[User] = []
    members: list[Member] = []


def _differences(a: msgspec.Struct, b: msgspec.Struct) -> list[str]:
    ours, theirs = msgspec.structs.asdict(a), msgspec.structs.asdict(b)
    return sorted(k for k in ours if ours[k] != theirs.get(k))


async def read_sqlite(path: str) -> tuple[list[Team], list[KeyRecord]]:
    """Every team and every key (revoked too) of a local-profile store file."""
    if not Path(path).is_file():
        raise NotFound(f"--from: {path} is not a file")
    store = SqliteKeyStore(path)
    await store.open()
    try:
        return await store.list_teams(), await store.list_keys(include_revoked=True)
    finally:
        await store.close()


async def read_people(path: str) -> People:
    """Every user and member budget of a local-profile store file."""
    store = SqliteKeyStore(path)
    await store.open()
    try:
        members = [m for t in await store.list_teams()
                   for m in await store.list_members(t.id)]
        return People(users=await store.list_users(), members=members)
    finally:
        await store.close()


def _same(a: User | Member, b: User | Member) -> list[str]:
    """What differs between a local and a destination budget, timestamps aside."""
    skip = {"created_at", "updated_at"}
    return [d for d in _differences(a, b) if d not in skip]


async def _copy_people(conn: AsyncConnection[Any], people: People,
                       counts: dict[str, int]) -> None:
    for user in people.users:
        params = {"name": user.name, "email": user.email, "display_name": user.display_name,
                  "revision": user.revision, "created_at": user.created_at,
                  "updated_at": user.updated_at, **msgspec.structs.asdict(user.limits)}
        if await fetch_one(conn, sql.queries["import_user"], params) is not None:
            counts["users_added"] += 1
            continue
        existing = await fetch_one(conn, sql.queries["find_user"], {"name": user.name})
        assert existing is not None  # the insert only stops on this name
        diff = _same(user, ROWS.user(existing))
        if diff:
            raise ImportConflict(f"user {user.name!r}: differs in {', '.join(diff)}; "
                                 "nothing was imported")
        counts["users_unchanged"] += 1
    for member in people.members:
        where = {"team_id": member.team_id, "user_name": member.user}
        params = {**where, "revision": member.revision, "created_at": member.created_at,
                  "updated_at": member.updated_at, **msgspec.structs.asdict(member.limits)}
        if await fetch_one(conn, sql.queries["import_member"], params) is not None:
            counts["members_added"] += 1
            continue
        existing = await fetch_one(conn, sql.queries["find_member"], where)
        assert existing is not None
        diff = _same(member, ROWS.member(existing))
        if diff:
            raise ImportConflict(f"member {member.user!r} of {member.team_id}: differs in "
                                 f"{', '.join(diff)}; nothing was imported")
        counts["members_unchanged"] += 1


def _team_params(t: Team) -> dict[str, Any]:
    return {"id": t.id, "name": t.name, "region": t.region, "guardrails": list(t.guardrails),
            "revision": t.revision, "created_at": t.created_at,
            **msgspec.structs.asdict(t.limits)}


def _key_params(k: KeyRecord) -> dict[str, Any]:
    return {"id": k.id, "team_id": k.team_id, "key_hash": k.key_hash,
            "display_prefix": k.display_prefix, "name": k.name, "user_name": k.user,
            "allowed_models": None if k.allowed_models is None else list(k.allowed_models),
            "expires_at": k.expires_at, "revoked_at": k.revoked_at, "revision": k.revision,
            "created_at": k.created_at, **msgspec.structs.asdict(k.limits)}


class _Kind(NamedTuple):
    """How one kind of record is copied: the same steps for teams and for keys."""

    name: str
    """``team`` or ``key``; also names the :class:`ImportReport` counters."""
    insert: str
    """Query inserting the row unless its id, name or hash is taken (then no row)."""
    by_id: str
    """Query reading the destination row with the same id."""
    params: Callable[[Any], dict[str, Any]]
    from_row: Callable[[dict[str, Any]], msgspec.Struct]
    clash: Callable[[Any], str]
    """The conflict when another row already holds the record's name or hash."""


_TEAMS = _Kind("team", "import_team", "team_by_id", _team_params, ROWS.team,
               lambda t: f"team {t.id} ({t.name!r}): another team already has this name")
_KEYS = _Kind("key", "import_key", "get_key", _key_params, ROWS.key,
              lambda k: f"key {k.id}: another key already has this hash")


async def _copy(conn: AsyncConnection[Any], kind: _Kind, records: list[Any],
                counts: dict[str, int], progress: Callable[[str], None]) -> None:
    for i, record in enumerate(records, 1):
        row = await fetch_one(conn, sql.queries[kind.insert], kind.params(record))
        if row is None:
            existing = await fetch_one(conn, sql.queries[kind.by_id], {"id": record.id})
            if existing is None:
                raise ImportConflict(f"{kind.clash(record)}; nothing was imported")
            diff = _differences(record, kind.from_row(existing))
            if diff:
                raise ImportConflict(f"{kind.name} {record.id}: differs in "
                                     f"{', '.join(diff)}; nothing was imported")
            counts[f"{kind.name}s_unchanged"] += 1
        else:
            counts[f"{kind.name}s_added"] += 1
        if i % 500 == 0:
            progress(f"{kind.name}s: {i}/{len(records)}")


async def copy_records(conn: AsyncConnection[Any], teams: list[Team], keys: list[KeyRecord],
                       *, people: People | None = None,
                       progress: Callable[[str], None] = lambda _: None) -> ImportReport:
    """Copy ``teams``, ``keys`` and ``people`` on ``conn``, inside the caller's
    transaction (``mayu keys import`` adds the spend in the same one:
    :mod:`gateway.governance._import`)."""
    people = people or People()
    # The user-name rule holds here too: a file a lenient older gateway wrote could
    # name a user the admin API could not manage ('a/b') or a key's user '*'.
    for key in keys:
        if key.user is not None:
            check_user_name(key.user)
    for user in people.users:
        check_user_name(user.name)
    for member in people.members:
        check_user_name(member.user, default_allowed=True)
    counts = {f"{kind}_{what}": 0 for kind in ("teams", "keys", "users", "members")
              for what in ("added", "unchanged")}
    await _copy(conn, _TEAMS, teams, counts, progress)
    await _copy(conn, _KEYS, keys, counts, progress)
    await _copy_people(conn, people, counts)
    return ImportReport(**counts)


async def import_records(pool: Pool, teams: list[Team], keys: list[KeyRecord], *,
                         people: People | None = None,
                         progress: Callable[[str], None] = lambda _: None) -> ImportReport:
    """Copy ``teams``, ``keys`` and ``people`` in one transaction (see the module
    docstring)."""
    async with connection(pool, "key store database") as conn, conn.transaction():
        return await copy_records(conn, teams, keys, people=people, progress=progress)
