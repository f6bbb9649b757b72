"""Choosing the configured key store: SQLite (local profile) or Postgres (shared).

The Postgres pieces are imported lazily, so the local profile (and the CLI working on
it) never needs a database driver to be importable or a server to be reachable.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gateway.config import Settings, resolve_secret
from gateway.errors import ConfigError
from gateway.keys._derive import RotationSecrets, checked_secret
from gateway.keys._model import KeyStore
from gateway.keys._sqlite import SqliteKeyStore


def sqlite_path(settings: Settings, configured: str | None) -> str:
    """A store file: the configured path, or ``<data_dir>/mayu.db``."""
    return os.path.expanduser(configured or os.path.join(settings.data_dir, "mayu.db"))


def rotation_secrets(settings: Settings) -> RotationSecrets | None:
    """The configured rotation secrets (``server.rotation_secret_ref`` and its previous
    ones), resolved now; None when not configured."""
    server = settings.server
    if server.rotation_secret_ref is None:
        if server.rotation_secret_previous_refs:
            raise ConfigError("server.rotation_secret_previous_refs: needs "
                              "server.rotation_secret_ref (the current one)")
        return None

    def read(key: str, ref: str) -> bytes:
        return checked_secret(resolve_secret(ref, key=key), key=key)

    return RotationSecrets(
        read("server.rotation_secret_ref", server.rotation_secret_ref),
        previous=[read(f"server.rotation_secret_previous_refs[{i}]", ref)
                  for i, ref in enumerate(server.rotation_secret_previous_refs)])


class _OwningStore:
    """A Postgres key store that also owns (and on close, closes) its own pool."""

    def __init__(self, store: Any, pool: Any) -> None:
        self._store, self._pool = store, pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def close(self) -> None:
        try:
            await self._store.close()
        finally:
            await self._pool.close()


async def open_key_store(settings: Settings, *, pool: Any = None) -> KeyStore:
    """Open the key store ``settings.key_store`` selects; the caller closes it.

    In shared mode the app passes its own open ``pool``; without one (the CLI) a pool
    is opened here and closed with the store.
    """
    if settings.key_store.type != "postgres":
        store = SqliteKeyStore(sqlite_path(settings, settings.key_store.path),
                               rotation_secrets=rotation_secrets(settings))
        await store.open()
        return store
    from gateway import keys
    from gateway.db import open_pool_now

    if settings.database is None:  # load_settings already refuses this; be explicit
        raise ConfigError("database: required when key_store.type is postgres")
    postgres_store: Callable[..., KeyStore] | None = getattr(keys, "PostgresKeyStore", None)
    if postgres_store is None:
        raise ConfigError("key_store.type: postgres is not available in this build")
    derivation = rotation_secrets(settings)
    if pool is not None:
        return postgres_store(pool, rotation_secrets=derivation)
    own = await open_pool_now(settings.database, name="mayu-cli", what="key store database")
    # _OwningStore satisfies KeyStore by delegating every other attribute (__getattr__).
    return _OwningStore(postgres_store(own, rotation_secrets=derivation), own)
