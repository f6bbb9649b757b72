"""Choosing the configured key store: SQLite (local profile) or Postgres (shared).

The Postgres pieces are imported lazily, so the local profile (and the CLI working on
it) never needs a database driver to be importable or a server to be reachable.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gateway.config import Settings
from gateway.errors import ConfigError
from gateway.keys._model import KeyStore
from gateway.keys._sqlite import SqliteKeyStore


def sqlite_path(settings: Settings, configured: str | None) -> str:
    """A store file: the configured path, or ``<data_dir>/mayu.db``."""
    return os.path.expanduser(configured or os.path.join(settings.data_dir, "mayu.db"))


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
        store = SqliteKeyStore(sqlite_path(settings, settings.key_store.path))
        await store.open()
        return store
    from gateway import keys
    from gateway.db import open_pool_now

    if settings.database is None:  # load_settings already refuses this; be explicit
        raise ConfigError("database: required when key_store.type is postgres")
    postgres_store: Callable[[Any], KeyStore] | None = getattr(keys, "PostgresKeyStore", None)
    if postgres_store is None:
        raise ConfigError("key_store.type: postgres is not available in this build")
    if pool is not None:
        return postgres_store(pool)
    own = await open_pool_now(settings.database, name="mayu-cli", what="key store database")
    # _OwningStore satisfies KeyStore by delegating every other attribute (__getattr__).
    return _OwningStore(postgres_store(own), own)
