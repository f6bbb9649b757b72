"""Virtual keys, teams and principals (the key-store interface and its stores)."""

from gateway.keys._bootstrap import ensure_demo, ensure_teams
from gateway.keys._model import (
    DEFAULT_MEMBER,
    KEY_PREFIX,
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
from gateway.keys._open import open_key_store, rotation_secrets
from gateway.keys._postgres import PostgresKeyStore
from gateway.keys._sessions import ConsoleSession, ConsoleSessionStore, SessionAccess
from gateway.keys._sqlite import SqliteKeyStore

__all__ = [
    "ConsoleSession",
    "ConsoleSessionStore",
    "SessionAccess",
    "DEFAULT_MEMBER",
    "KEY_PREFIX",
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
