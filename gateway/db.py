"""The shared profile's Postgres pool, and the ONE place database errors are translated.

:func:`open_pool` builds an :class:`AsyncConnectionPool` from :class:`DatabaseSettings`
(closed: the app lifespan opens it with ``await pool.open(wait=...)``, as psycopg's docs
recommend). A short pool ``timeout`` turns an exhausted pool or a dead database into a
quick 503 instead of a hung request.

:func:`wrap_exceptions` is the only translation of psycopg / pool failures into
:class:`gateway.errors.GovernanceUnavailable` (procrastinate's ``wrap_exceptions``); the
original error stays attached as ``__cause__``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import psycopg_pool
from psycopg.rows import dict_row

from gateway.config import DatabaseSettings, resolve_secret
from gateway.errors import GovernanceUnavailable

Pool = psycopg_pool.AsyncConnectionPool


def open_pool(db: DatabaseSettings, *, name: str = "inferplane") -> Pool:
    """A closed pool for ``db`` (the DSN resolved from ``database.dsn_ref``)."""
    dsn = resolve_secret(db.dsn_ref, key="database.dsn_ref")
    return psycopg_pool.AsyncConnectionPool(
        dsn, open=False, name=name, min_size=db.pool_min_size, max_size=db.pool_max_size,
        timeout=db.pool_timeout_s,
        # Autocommit: an admission or settlement is ONE statement (a SQL function), so it
        # is its own transaction and costs one round trip; multi-statement work opens an
        # explicit ``conn.transaction()``.
        kwargs={"autocommit": True, "row_factory": dict_row,
                "connect_timeout": max(1, round(db.connect_timeout_s)),
                "application_name": name},
        reconnect_timeout=max(5.0, db.pool_timeout_s))


async def open_pool_now(db: DatabaseSettings, *, name: str, what: str) -> Pool:
    """An opened pool for a command-line tool: waits for its first connections, and on
    failure closes it and raises GovernanceUnavailable naming ``what``."""
    pool = open_pool(db, name=name)
    try:
        async with wrap_exceptions(what):
            await pool.open(wait=True, timeout=db.connect_timeout_s + 5)
    except BaseException:
        await pool.close()
        raise
    return pool


@asynccontextmanager
async def wrap_exceptions(what: str = "governance database") -> AsyncIterator[None]:
    """Translate storage failures raised inside the block into GovernanceUnavailable."""
    try:
        yield
    except psycopg_pool.PoolTimeout as exc:
        raise GovernanceUnavailable(f"{what}: no database connection available "
                                    f"({exc})") from exc
    except psycopg_pool.PoolClosed as exc:
        raise GovernanceUnavailable(f"{what}: the connection pool is closed") from exc
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise GovernanceUnavailable(f"{what}: database unavailable ({exc})") from exc


_checks: dict[int, asyncio.Task[None]] = {}


def _check_pool_soon(pool: Pool) -> None:
    """Validate the pool's idle connections in the background (once at a time).

    A database restart leaves every pooled connection broken, and the pool only notices
    one per checkout; checking them all at the first failure makes the replica recover
    after one failed request instead of ``max_size`` of them.
    """
    if id(pool) in _checks or pool.closed:
        return
    task = asyncio.get_running_loop().create_task(pool.check())
    _checks[id(pool)] = task
    task.add_done_callback(lambda t: (_checks.pop(id(pool), None),
                                      t.cancelled() or t.exception()))


@asynccontextmanager
async def connection(pool: Pool, what: str = "governance database"
                     ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A pooled connection, with storage errors translated (:func:`wrap_exceptions`)."""
    async with wrap_exceptions(what):
        try:
            async with pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError):
            _check_pool_soon(pool)
            raise


async def fetch_one(conn: psycopg.AsyncConnection[Any], query: str,
                    params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """First row of ``query`` as a dict, whatever the connection's own row factory."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        return await cur.fetchone()


async def fetch_all(conn: psycopg.AsyncConnection[Any], query: str,
                    params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every row of ``query`` as dicts, whatever the connection's own row factory."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        return await cur.fetchall()


__all__ = ["Pool", "connection", "fetch_all", "fetch_one", "open_pool", "wrap_exceptions"]
