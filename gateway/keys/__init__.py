"""Virtual keys, teams and principals (the key-store interface and its stores)."""

from gateway.keys._model import (
    KEY_PREFIX,
    KeyLimits,
    KeyRecord,
    KeyStore,
    Principal,
    Team,
    TeamLimits,
    hash_key,
    new_key,
)

__all__ = [
    "KEY_PREFIX",
    "KeyLimits",
    "KeyRecord",
    "KeyStore",
    "Principal",
    "Team",
    "TeamLimits",
    "hash_key",
    "new_key",
]
