"""Virtual keys, teams and principals (the key-store interface and its stores)."""

from gateway.keys._bootstrap import ensure_demo, ensure_teams
from gateway.keys._import import ImportReport, People, copy_records, read_people, read_sqlite
from gateway.keys._members import Label, TeamMember, TeamMembers
from gateway.keys._model import (
    DEFAULT_MEMBER,
    KEY_PREFIX,
    MAX_GRACE_S,
    KeyChanges,
    KeyLimits,
    KeyRecord,
    KeyStore,
    Member,
    MemberLimits,
    Principal,
    Rotation,
    Team,
    TeamLimits,
    User,
    hash_key,
    new_key,
)
from gateway.keys._open import open_key_store, rotation_secrets, sqlite_path
from gateway.keys._postgres import PostgresKeyStore
from gateway.keys._sessions import ConsoleSession, ConsoleSessionStore, SessionAccess
from gateway.keys._sqlite import SqliteKeyStore

__all__ = [
    "ConsoleSession",
    "ConsoleSessionStore",
    "SessionAccess",
    "DEFAULT_MEMBER",
    "KEY_PREFIX",
    "MAX_GRACE_S",
    "Label",
    "TeamMember",
    "TeamMembers",
    "ImportReport",
    "People",
    "copy_records",
    "read_people",
    "read_sqlite",
    "sqlite_path",
    "Member",
    "MemberLimits",
    "User",
    "KeyChanges",
    "KeyLimits",
    "KeyRecord",
    "KeyStore",
    "PostgresKeyStore",
    "Principal",
    "Rotation",
    "Team",
    "SqliteKeyStore",
    "TeamLimits",
    "hash_key",
    "ensure_demo",
    "ensure_teams",
    "new_key",
    "open_key_store",
    "rotation_secrets",
]
