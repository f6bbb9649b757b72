"""The shared profile's Postgres pool, and the ONE place database errors are translated.

:func:`open_pool` builds an :class:`AsyncConnectionPool` from :class:`DatabaseSettings`
(closed: the app lifespan opens it with ``await pool.open(wait=...)``, as psycopg's docs
recommend). A short pool ``timeout`` turns an exhausted pool or a dead database into a
quick 503 instead of a hung request, and the ``statement_timeout`` it sets on each of its
sessions (``database.statement_timeout_s``) does the same for a statement that got a
connection but no answer (a locked table, a stalled database): the server cancels it.
``mayu migrate`` connects on its own, without it: a migration may wait for locks.

:func:`wrap_exceptions` is the only translation of psycopg / pool failures into
:class:`gateway.errors.GovernanceUnavailable` (procrastinate's ``wrap_exceptions``); the
original error stays attached as ``__cause__``.

Through a failover (docs/failover.md): the DSN lists every member with
``target_session_attrs=read-write``, so a new connection only ever lands on the primary.
A connection that fails (its server died or was demoted: a connection error, an admin
shutdown) or answers read-only (SQLSTATE 25006: a standby, reached by a DSN without the
read-write attribute) is closed and replaced by the pool, which also checks its idle
connections at once; until a primary answers, every call fails within ``pool_timeout_s``
(+ ``statement_timeout_s``) into a 503 with ``Retry-After``. :func:`maybe_committed` says
whether a failed call may still have committed (its answer lost with the connection):
the governance store then resolves it by its request or permit id.

A commit is confirmed only once the synchronous standby has it: a statement cancelled
while its commit waits for the standby (the statement timeout, a client's cancel) is
answered as a success by PostgreSQL, with a WARNING that it "has already committed
locally, but might not have been replicated to the standby". The pool's sessions watch
for that warning, and a call that drew it fails as :class:`UnconfirmedCommit` (a 503,
maybe committed): a settlement stays in the journal until a replay is confirmed, an
admission's permit is refunded, instead of being taken as stored when a failover could
still lose it.

PostgreSQL disarms ``statement_timeout`` before a commit, so a synchronous standby that
stalls without disconnecting would hold a commit's wait, and the request behind it,
past every configured timeout. :func:`fetch_one` and :func:`fetch_all` therefore bound
each call on the client too: ``statement_timeout_s`` + :data:`DEADLINE_MARGIN_S`, then
psycopg cancels the statement (at most 10 s more: its cancel and wait are bounded, then
it closes the connection) and the call fails as :class:`UnconfirmedCommit` — maybe
committed, since the cancel may have met a commit already written on the primary.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from gateway.config import DatabaseSettings, resolve_secret
from gateway.errors import GovernanceUnavailable

Pool = psycopg_pool.AsyncConnectionPool


def open_pool(db: DatabaseSettings, *, name: str = "inferplane",
              statement_timeout_s: float | None = None) -> Pool:
    """A closed pool for ``db`` (the DSN resolved from ``database.dsn_ref``) whose
    sessions run with ``statement_timeout`` ``statement_timeout_s`` (None: the setting
    ``database.statement_timeout_s``; 0: none)."""
    dsn = resolve_secret(db.dsn_ref, key="database.dsn_ref")
    timeout_s = db.statement_timeout_s if statement_timeout_s is None else statement_timeout_s
    return psycopg_pool.AsyncConnectionPool(
        dsn, open=False, name=name, min_size=db.pool_min_size, max_size=db.pool_max_size,
        timeout=db.pool_timeout_s, configure=_session_setup(timeout_s),
        # Autocommit: an admission or settlement is ONE statement (a SQL function), so it
        # is its own transaction and costs one round trip; multi-statement work opens an
        # explicit ``conn.transaction()``.
        kwargs={"autocommit": True, "row_factory": dict_row,
                "connect_timeout": max(1, round(db.connect_timeout_s)),
                "application_name": name},
        reconnect_timeout=max(5.0, db.pool_timeout_s))


def _session_setup(timeout_s: float) -> Callable[[psycopg.AsyncConnection[Any]],
                                                  Awaitable[None]]:
    """What the pool runs once on each new connection: watch its notices for an
    unconfirmed commit (:class:`UnconfirmedCommit`), set the session's statement timeout
    (none for 0, leaving the role's or the DSN's own, if any).

    Set on the session rather than as ``options=-c statement_timeout`` in the DSN, so the
    operator's own DSN ``options`` (and ``PGOPTIONS``) stay as written, and the
    migrations, which connect with the DSN alone, never get it."""
    # Postgres counts whole milliseconds: round up, so a positive value never means 0.
    value = f"{math.ceil(timeout_s * 1000)}ms" if timeout_s > 0 else None

    async def setup(conn: psycopg.AsyncConnection[Any]) -> None:
        _watch_commits(conn)
        if value is not None:
            setattr(conn, _DEADLINE, timeout_s + DEADLINE_MARGIN_S)
            await conn.execute("SELECT set_config('statement_timeout', %s, false)",
                               (value,))

    return setup


class UnconfirmedCommit(psycopg.OperationalError):
    """the primary committed but stopped waiting for its synchronous standby (the
    statement was cancelled): a failover may still lose it"""


DEADLINE_MARGIN_S = 1.0
"""A pooled call's client-side deadline past ``statement_timeout_s``: the server's own
timeout answers first for a statement that is still running; only a wait it does not
cover (a commit waiting for its synchronous standby) reaches this one."""
_DEADLINE = "_mayu_deadline_s"

_UNCONFIRMED = "canceling wait for synchronous replication"
"""How PostgreSQL's WARNING starts when a statement stopped waiting for its synchronous
standby after committing locally (syncrep.c; an English ``lc_messages`` is assumed)."""
_FLAG = "_mayu_unconfirmed"


def _watch_commits(conn: psycopg.AsyncConnection[Any]) -> None:
    """Note on ``conn`` (checked by :func:`_confirmed`) each unconfirmed-commit WARNING."""
    flag = [False]  # the handler holds the flag, not the connection (no cycle)

    def notice(diag: psycopg.errors.Diagnostic) -> None:
        if (diag.severity_nonlocalized == "WARNING"
                and (diag.message_primary or "").startswith(_UNCONFIRMED)):
            flag[0] = True

    conn.add_notice_handler(notice)
    setattr(conn, _FLAG, flag)


def _confirmed(conn: psycopg.AsyncConnection[Any]) -> None:
    """Raise UnconfirmedCommit if a statement on ``conn`` drew the warning since the
    last check (and clear it)."""
    flag: list[bool] | None = getattr(conn, _FLAG, None)
    if flag is not None and flag[0]:
        flag[0] = False
        raise UnconfirmedCommit(UnconfirmedCommit.__doc__ or "")


async def open_pool_now(db: DatabaseSettings, *, name: str, what: str) -> Pool:
    """An opened pool for a command-line tool: waits for its first connections, and on
    failure closes it and raises GovernanceUnavailable naming ``what``.

    Without a statement timeout: an operator runs these commands and watches them, and
    one of them (``mayu keys import``, one COPY of a whole key store) may rightly take
    longer than any request should."""
    pool = open_pool(db, name=name, statement_timeout_s=0)
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
    except psycopg.errors.QueryCanceled as exc:
        raise GovernanceUnavailable(f"{what}: no answer within the statement timeout "
                                    f"({exc})") from exc
    except UnconfirmedCommit as exc:
        raise GovernanceUnavailable(f"{what}: {exc}") from exc
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        raise GovernanceUnavailable(
            f"{what}: the database is read-only (a standby, not the primary); nothing is "
            "admitted until a primary answers. List every member in database.dsn_ref "
            "with target_session_attrs=read-write (docs/failover.md)") from exc
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise GovernanceUnavailable(f"{what}: database unavailable ({exc})") from exc


_LOST = (psycopg.OperationalError, psycopg.InterfaceError,
         psycopg.errors.ReadOnlySqlTransaction)
"""Errors after which a connection is not used again: it failed, or it reaches a standby."""


def maybe_committed(exc: BaseException) -> bool:
    """Whether a call that failed with ``exc`` (a GovernanceUnavailable from
    :func:`wrap_exceptions`, or its cause) may have committed all the same: its
    connection was lost after the statement may have reached the server, so the answer
    (the COMMIT's acknowledgement) may be what was lost. False when nothing was sent (no
    connection from the pool), or the server refused or cancelled the statement (read
    only, statement timeout: rolled back)."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if isinstance(cause, (psycopg_pool.PoolTimeout, psycopg_pool.PoolClosed,
                          psycopg.errors.QueryCanceled,
                          psycopg.errors.ReadOnlySqlTransaction)):
        return False
    return isinstance(cause, (psycopg.OperationalError, psycopg.InterfaceError))


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
                try:
                    yield conn
                except psycopg.errors.ReadOnlySqlTransaction:
                    await conn.close()  # a standby's session: the pool replaces it
                    raise
                _confirmed(conn)
        except (psycopg.errors.QueryCanceled, UnconfirmedCommit):
            raise  # a statement out of time: the connection itself is fine
        except _LOST:
            _check_pool_soon(pool)
            raise


class HeldConnections:
    """Connections a store's hot calls keep between calls instead of handing them back.

    psycopg's pool hands out its idle connections first in, first out, so consecutive
    calls cycle through every connection of the pool: each a Postgres backend with cold
    caches that plans the called functions' statements again; a kept connection keeps
    its backend's plans warm (``tests/bench/hotteam.py`` measures it; the run is in
    ``tests/bench/NOTES.md``).

    :meth:`connection` takes the most recently kept connection, else one from the pool.
    After a call that ended cleanly (no error, no transaction left open) it keeps it
    again, up to ``keep`` of them, never the pool's last one (at most ``max_size - 1``, so
    the other queries always have one); a statement cancelled by the statement timeout
    counts as clean (the connection is sound; keeping it spares the next call a wait for
    the pool while the database is stalled). Any other ending gives it back to the pool,
    which checks it and replaces a broken one; a database error is translated as
    :func:`connection` translates it. A kept connection goes back to the pool
    ``max_age_s`` after it was taken from it, so the pool's own recycling and health
    checks still see every connection. :meth:`close` gives every kept connection back
    (before the pool is closed).
    """

    def __init__(self, pool: Pool, *, keep: int, max_age_s: float = 60.0,
                 what: str = "governance database") -> None:
        self._pool = pool
        self._keep = max(0, min(keep, pool.max_size - 1))
        self._max_age_s = max_age_s
        self._what = what
        self._kept: list[tuple[psycopg.AsyncConnection[Any], float]] = []
        self._closed = False

    @property
    def kept(self) -> int:
        """How many connections are kept now (idle, out of the pool)."""
        return len(self._kept)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with wrap_exceptions(self._what):
            if self._kept:
                conn, taken = self._kept.pop()
            else:
                conn, taken = await self._pool.getconn(), time.monotonic()
            clean = False
            try:
                yield conn
                clean = True
                _confirmed(conn)
            except (psycopg.errors.QueryCanceled, UnconfirmedCommit):
                clean = True
                raise
            except _LOST as exc:
                if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
                    await conn.close()  # a standby's session: the pool replaces it
                _check_pool_soon(self._pool)
                raise
            finally:
                if clean and self._keeps(conn, taken):
                    self._kept.append((conn, taken))
                else:
                    await self._pool.putconn(conn)

    def _keeps(self, conn: psycopg.AsyncConnection[Any], taken: float) -> bool:
        return (not self._closed and len(self._kept) < self._keep and not conn.closed
                and conn.info.transaction_status == TransactionStatus.IDLE
                and time.monotonic() - taken < self._max_age_s)

    async def close(self) -> None:
        """Give every kept connection back to the pool; later calls keep none."""
        self._closed = True
        kept, self._kept = self._kept, []
        for conn, _ in kept:
            await self._pool.putconn(conn)


_DURABILITY = """SELECT current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('synchronous_standby_names') AS synchronous_standby_names,
       pg_is_in_recovery() AS in_recovery,
       (SELECT count(*) FROM pg_stat_replication) AS standbys"""


def durability_problems(*, synchronous_commit: str, synchronous_standby_names: str,
                        in_recovery: bool, standbys: int) -> list[str]:
    """Why commits the database acknowledges could vanish in a failover, from its
    settings as the gateway's sessions see them (empty: none found). docs/failover.md,
    "Durability", says which settings make "admitted" and "settled" survive one."""
    problems = []
    if in_recovery:
        problems.append("database.dsn_ref reaches a standby (read-only): nothing is "
                        "admitted until it is promoted; list every member with "
                        "target_session_attrs=read-write")
    if synchronous_commit == "off":
        problems.append("synchronous_commit=off: the database acknowledges commits "
                        "before they are durable even on itself; a crash loses the last "
                        "admissions and settlements the gateway was told are stored")
    elif standbys and (not synchronous_standby_names.strip()
                       or synchronous_commit == "local"):
        names = synchronous_standby_names or "''"
        problems.append(
            f"the primary streams to {standbys} standby(s) but acknowledges commits "
            f"before any of them has them (synchronous_commit={synchronous_commit}, "
            f"synchronous_standby_names={names}): a failover "
            "can lose admissions and settlements the gateway was told are stored, and a "
            "team could spend the same budget twice. Set synchronous_standby_names "
            "(Patroni: synchronous_mode: true) with synchronous_commit on, remote_write "
            "or remote_apply")
    return problems


async def durability_check(pool: Pool) -> list[str]:
    """Log, loudly, each :func:`durability_problems` of the pool's database (at startup);
    returns them. Never fails the start: an unreadable setting is logged as such."""
    log = logging.getLogger("mayu.db")
    try:
        async with connection(pool) as conn:
            row = await fetch_one(conn, _DURABILITY)
    except GovernanceUnavailable as exc:
        log.warning("database durability not checked: %s", exc)
        return []
    assert row is not None
    problems = durability_problems(
        synchronous_commit=str(row["synchronous_commit"]),
        synchronous_standby_names=str(row["synchronous_standby_names"]),
        in_recovery=bool(row["in_recovery"]), standbys=int(row["standbys"]))
    for problem in problems:
        log.warning("DURABILITY: %s (docs/failover.md)", problem)
    return problems


async def _execute(conn: psycopg.AsyncConnection[Any], cur: psycopg.AsyncCursor[Any],
                   query: str, params: Mapping[str, Any] | None,
                   prepare: bool | None = None) -> None:
    """``cur.execute`` within the pool session's client-side deadline, if it has one
    (module docstring); past it, :class:`UnconfirmedCommit`."""
    deadline: float | None = getattr(conn, _DEADLINE, None)
    if deadline is None:
        await cur.execute(query, params, prepare=prepare)
        return
    try:
        async with asyncio.timeout(deadline):
            await cur.execute(query, params, prepare=prepare)
    except TimeoutError as exc:
        flag: list[bool] | None = getattr(conn, _FLAG, None)
        if flag is not None:
            flag[0] = False  # this failure says it; the next call must not say it again
        raise UnconfirmedCommit(
            f"no answer within {deadline:g} s (statement timeout + "
            f"{DEADLINE_MARGIN_S:g} s): the call was cancelled and may have committed "
            "(a commit waiting for a stalled synchronous standby)") from exc


async def fetch_one(conn: psycopg.AsyncConnection[Any], query: str,
                    params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """First row of ``query`` as a dict, whatever the connection's own row factory."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await _execute(conn, cur, query, params)
        return await cur.fetchone()


async def fetch_all(conn: psycopg.AsyncConnection[Any], query: str,
                    params: Mapping[str, Any] | None = None, *,
                    prepare: bool | None = None) -> list[dict[str, Any]]:
    """Every row of ``query`` as dicts, whatever the connection's own row factory.
    ``prepare=False``: planned for its parameters at every call, never a cached generic
    plan (a read whose best plan depends on which optional filters are set)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await _execute(conn, cur, query, params, prepare)
        return await cur.fetchall()


__all__ = ["DEADLINE_MARGIN_S", "HeldConnections", "Pool", "UnconfirmedCommit", "connection",
           "durability_check", "durability_problems", "fetch_all", "fetch_one",
           "maybe_committed", "open_pool", "wrap_exceptions"]
