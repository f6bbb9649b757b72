"""The shared database's schema revision: migrate it, and refuse to run on a stale one.

The migrations ship inside the installed package (the top-level ``migrations`` package,
found with :mod:`importlib.resources`), so ``mayu migrate`` and the startup check need no
checkout and no ``alembic.ini``: alembic is driven with a programmatic
:class:`alembic.config.Config`. The repo-root ``alembic.ini`` points at the same
directory, so ``alembic upgrade head`` from a checkout still works.

:func:`schema_problem` compares the database's ``alembic_version`` rows with the code's
heads; the gateway (shared profile) and inferplaned refuse to start with that ONE line
(naming ``mayu migrate``) instead of failing later on a missing table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from gateway.errors import ConfigError

MIGRATE_HINT = "run `mayu migrate` (same config or INFERPLANE_DATABASE_URL) first"
_VERSION_TABLE = "alembic_version"


def script_location() -> str:
    """The packaged migrations directory (``migrations/`` with ``env.py``)."""
    return str(resources.files("migrations"))


def _config(url: str | None = None) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", script_location())
    if url is not None:
        # Config values go through ConfigParser interpolation: a %-escaped password
        # (%40 for '@') must reach env.py unchanged.
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@contextmanager
def _quiet_alembic() -> Iterator[None]:
    """Reading the script directory logs alembic's plugin set-up at INFO; a startup
    check must print nothing but its one line."""
    logger = logging.getLogger("alembic")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


@cache
def code_heads() -> tuple[str, ...]:
    """The head revision(s) of the packaged migrations (normally exactly one)."""
    with _quiet_alembic():
        from alembic.script import ScriptDirectory

        return tuple(sorted(ScriptDirectory.from_config(_config()).get_heads()))


def _known(revision: str) -> bool:
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    try:
        with _quiet_alembic():
            return ScriptDirectory.from_config(_config()).get_revision(revision) is not None
    except CommandError:
        return False


def schema_problem(db_heads: tuple[str, ...]) -> str | None:
    """None when the database is at the code's head; else one line saying what to do."""
    heads = code_heads()
    want = ", ".join(heads)
    if tuple(sorted(db_heads)) == heads:
        return None
    if not db_heads:
        return f"database: not migrated (no schema revision; this version needs {want}): " \
               f"{MIGRATE_HINT}"
    have = ", ".join(sorted(db_heads))
    if all(_known(r) for r in db_heads):
        return f"database: schema at revision {have}, this version needs {want}: " \
               f"{MIGRATE_HINT}"
    return (f"database: schema at revision {have}, unknown to this version (head {want}): "
            "it was migrated by a newer inferplane; run this version's image only after "
            "a matching `mayu migrate`, or upgrade it")


_HEADS_SQL = "SELECT version_num FROM alembic_version"


def database_heads(conn: psycopg.Connection[Any]) -> tuple[str, ...]:
    """The revisions recorded in ``alembic_version`` (empty: never migrated)."""
    row = conn.execute("SELECT to_regclass(%s)", (_VERSION_TABLE,)).fetchone()
    if row is None or row[0] is None:
        return ()
    return tuple(str(r[0]) for r in conn.execute(_HEADS_SQL).fetchall())


async def database_heads_async(conn: psycopg.AsyncConnection[Any]) -> tuple[str, ...]:
    """:func:`database_heads` on an async connection (the gateway's pool)."""
    cur = await conn.execute("SELECT to_regclass(%s)", (_VERSION_TABLE,))
    row = await cur.fetchone()
    value = row.get("to_regclass") if isinstance(row, dict) else (row[0] if row else None)
    if value is None:
        return ()
    cur = await conn.execute(_HEADS_SQL)
    return tuple(str(r["version_num"] if isinstance(r, dict) else r[0])
                 for r in await cur.fetchall())


async def check_schema(pool: Any) -> None:
    """Refuse, in one line naming ``mayu migrate``, a database not at the code's head:
    ``mayu serve`` checks before it starts; this covers every other way a store is
    opened on a pool (the app's components, the ``permits`` and ``accounts`` commands)."""
    from gateway.db import connection

    async with connection(pool, "governance database") as conn:
        problem = schema_problem(await database_heads_async(conn))
    if problem:
        raise ConfigError(problem)


def check_dsn(dsn: str, *, connect_timeout_s: float = 5.0) -> None:
    """Raise :class:`ConfigError` (one line) unless the database at ``dsn`` is at head."""
    try:
        with psycopg.connect(dsn, connect_timeout=max(1, round(connect_timeout_s)),
                             autocommit=True) as conn:
            problem = schema_problem(database_heads(conn))
    except psycopg.Error as exc:
        raise ConfigError(f"database.dsn_ref: cannot check the schema of "
                          f"{describe_dsn(dsn)} ({type(exc).__name__}: "
                          f"{str(exc).strip().splitlines()[0] if str(exc) else ''})") from exc
    if problem:
        raise ConfigError(problem)


def describe_dsn(dsn: str) -> str:
    """``host:port/dbname`` of a DSN, never its password (for progress and errors)."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "the configured database"
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    return f"{host}:{port}/{params.get('dbname') or params.get('user') or ''}"


@dataclass(frozen=True)
class Step:
    """One applied migration step, as :func:`upgrade` reports it."""

    revision: str
    down_revision: str | None
    doc: str
    seconds: float


def upgrade(dsn: str, *, target: str = "head",
            on_step: Callable[[Step], None] | None = None) -> tuple[str, ...]:
    """``alembic upgrade <target>`` on ``dsn`` with the packaged migrations.

    ``on_step`` is called after each revision's SQL ran (all of them commit together at
    the end: the migrations are transactional). Returns the database's heads afterwards.
    """
    from alembic import command

    started = [time.monotonic()]

    def progress(*, step: Any, **_: Any) -> None:
        now = time.monotonic()
        if on_step is not None:
            doc = (getattr(step.up_revision, "doc", None) or "").strip().splitlines()
            on_step(Step(revision=", ".join(step.up_revision_ids),
                         down_revision=", ".join(step.down_revision_ids) or None,
                         doc=doc[0] if doc else "", seconds=now - started[0]))
        started[0] = now

    cfg = _config(dsn)
    cfg.attributes["on_version_apply"] = progress
    command.upgrade(cfg, target)
    with psycopg.connect(dsn, autocommit=True) as conn:
        return database_heads(conn)


__all__ = ["MIGRATE_HINT", "Step", "check_dsn", "code_heads", "database_heads",
           "database_heads_async", "describe_dsn", "schema_problem", "script_location",
           "upgrade"]
