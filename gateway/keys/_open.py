"""Choosing the configured key store: SQLite (local profile) or Postgres (shared).

The Postgres pieces are imported lazily, so the local profile (and the CLI working on
it) never needs a database driver to be importable or a server to be reachable.
"""

from __future__ import annotations

import os

from gateway.config import Settings
from gateway.keys._model import KeyStore
from gateway.keys._sqlite import SqliteKeyStore


def sqlite_path(settings: Settings, configured: str | None) -> str:
    """A store file: the configured path, or ``<data_dir>/mayu.db``."""
    return os.path.expanduser(configured or os.path.join(settings.data_dir, "mayu.db"))


async def open_key_store(settings: Settings) -> KeyStore:
    """Open the key store ``settings.key_store`` selects; the caller closes it."""
    if settings.key_store.type == "postgres":
        from gateway.db import open_pool
        from gateway.keys import PostgresKeyStore  # type: ignore[attr-defined]

        if settings.database is None:  # load_settings already refuses this; be explicit
            from gateway.errors import ConfigError
            raise ConfigError("database: required when key_store.type is postgres")
        pool = await open_pool(settings.database)
        return PostgresKeyStore(pool)  # type: ignore[no-any-return]
    store = SqliteKeyStore(sqlite_path(settings, settings.key_store.path))
    await store.open()
    return store
