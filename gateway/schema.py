"""The shared database's schema revision: migrate it, and refuse to run on a stale one.

The migrations ship inside the installed package (the top-level ``migrations`` package,
found with :mod:`importlib.resources`), so ``mayu migrate`` and the startup check need no
checkout and no ``alembic.ini``: alembic is driven with a programmatic
:class:`alembic.config.Config`. The repo-root ``alembic.ini`` points at the same
directory, so ``alembic upgrade head`` from a checkout still works.

:func:`schema_problem` compares the database's ``alembic_version`` rows with the code's
heads; the gateway (shared profile) and inferplaned refuse to start with that ONE line
(naming ``mayu migrate``) instead of failing later on a missing table.

Databases created before 0.1.0 carry a pre-release revision (``0001`` … ``0009``) that
the packaged migrations no longer hold. :func:`upgrade` converts one at ``0009`` (the
last pre-release) to the baseline in one transaction, after checking that its tables,
columns, indexes and constraints are exactly the baseline's (:func:`structure`): the
rows stay as they are, only the functions are replaced, so every committed, liability
and reserved figure is kept. Any other pre-release revision is refused with what to do.
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
BASELINE_REVISION = "v010_baseline"
PRERELEASE_REVISIONS = tuple(f"{n:04d}" for n in range(1, 10))
"""Revisions of the pre-release chain (removed at 0.1.0); ``0009`` was its head."""
_CONVERTIBLE = "0009"
ADDED_SINCE_PRERELEASE = ("key_rotations", "members", "request_log")
"""Files of the 0.1.0 baseline (``migrations/baseline/``) whose tables revision 0009 did
not have: the conversion creates them (in its transaction, before comparing the tables
with the baseline's)."""
PREVIOUS_FUNCTIONS: tuple[str, ...] = (
    "inferplane_admit_checked_v1", "inferplane_admit_one_v1", "inferplane_admit_v1",
    "inferplane_resolve_v1", "inferplane_settle_admit_v1", "inferplane_settle_one_v1",
    "inferplane_settle_v1")
"""Functions a migration keeps installed for one release after their ``_vN+1`` replaced
them in ``sql/`` (rolling upgrades; CONTRIBUTING.md): the _v1 entry points revision
``v012_functions_v2`` replaced, for the next release's first revision to drop. The
structure test ignores them."""
_PRERELEASE_HINT = (
    "it was migrated by a pre-release build; 0.1.0 converts only the last pre-release "
    "revision (0009): run `mayu migrate` from inferplane commit cdf51f7 first (it brings "
    "the database to 0009), then `mayu migrate` from this version")


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
    if tuple(db_heads) == (_CONVERTIBLE,):
        return (f"database: pre-release schema (revision {_CONVERTIBLE}), this version needs "
                f"{want}: {MIGRATE_HINT} (it converts the database and keeps every figure)")
    if all(r in PRERELEASE_REVISIONS for r in db_heads):
        return f"database: schema at pre-release revision {have}: {_PRERELEASE_HINT}"
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

    converted = convert_prerelease(dsn)
    if converted is not None and on_step is not None:
        on_step(converted)
    cfg = _config(dsn)
    cfg.attributes["on_version_apply"] = progress
    command.upgrade(cfg, target)
    with psycopg.connect(dsn, autocommit=True) as conn:
        return database_heads(conn)


# -- the pre-release conversion and the structure it compares -------------------------

_STRUCTURE_SQL: dict[str, str] = {
    "columns": """SELECT table_name, ordinal_position, column_name, data_type, is_nullable,
                         coalesce(column_default, '')
                    FROM information_schema.columns
                   WHERE table_schema = %(schema)s AND table_name <> 'alembic_version'""",
    "indexes": """SELECT tablename, indexname,
                         replace(indexdef, ' ' || %(schema)s || '.', ' ')
                    FROM pg_indexes
                   WHERE schemaname = %(schema)s AND tablename <> 'alembic_version'""",
    "constraints": """SELECT t.relname, c.conname, c.contype::text,
                             pg_get_constraintdef(c.oid)
                        FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
                       WHERE c.connamespace = %(schema)s::regnamespace
                         AND t.relname <> 'alembic_version'""",
    "functions": """SELECT p.proname, pg_get_function_identity_arguments(p.oid),
                           pg_get_function_result(p.oid), p.prokind::text,
                           p.provolatile::text, l.lanname, md5(p.prosrc),
                           coalesce(array_to_string(p.proconfig, ','), '')
                      FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
                     WHERE p.pronamespace = %(schema)s::regnamespace
                       AND starts_with(p.proname, 'inferplane_')""",
    "views": """SELECT viewname, definition FROM pg_views
                 WHERE schemaname = %(schema)s""",
}


def structure(conn: psycopg.Connection[Any], schema: str = "public"
              ) -> dict[str, set[tuple[Any, ...]]]:
    """The structure of inferplane's objects in ``schema``: columns (in order, with type,
    nullability and default), indexes, constraints, functions (arguments, result, kind,
    volatility, language, body hash, settings) and views (definition). Two databases
    with equal structures run the same SQL the same way."""
    out: dict[str, set[tuple[Any, ...]]] = {}
    for part, query in _STRUCTURE_SQL.items():
        rows = conn.execute(query, {"schema": schema}).fetchall()
        # A default naming a sequence names its schema when that is not public.
        out[part] = {tuple(str(v).replace(f"{schema}.", "") for v in row) for row in rows}
    return out


def files_structure(conn: psycopg.Connection[Any], *, baseline: bool = False
                    ) -> dict[str, set[tuple[Any, ...]]]:
    """The structure the schema files build: the present ``sql/`` files, or with
    ``baseline`` the frozen 0.1.0 texts (``migrations/baseline/``). Made in a scratch
    schema inside the caller's transaction and dropped again."""
    import sql

    conn.execute("CREATE SCHEMA inferplane_baseline_check")
    conn.execute("SET LOCAL search_path = inferplane_baseline_check, public")
    for name in sql.BASELINE if baseline else sql.SCHEMA:
        conn.execute(sql.baseline_script(name) if baseline else sql.script(name))
    found = structure(conn, "inferplane_baseline_check")
    conn.execute("SET LOCAL search_path = public")
    conn.execute("DROP SCHEMA inferplane_baseline_check CASCADE")
    return found


def _differences(have: dict[str, set[tuple[Any, ...]]],
                 want: dict[str, set[tuple[Any, ...]]]) -> list[str]:
    lines = []
    for part, what in (("columns", "column"), ("indexes", "index"),
                       ("constraints", "constraint")):
        for row in sorted(want[part] - have[part]):
            lines.append(f"missing {what}: {' '.join(map(str, row[:4]))}")
        for row in sorted(have[part] - want[part]):
            lines.append(f"unexpected {what}: {' '.join(map(str, row[:4]))}")
    return lines


def convert_prerelease(dsn: str) -> Step | None:
    """Move a database at the last pre-release revision (``0009``) to the baseline, in
    one transaction: the tables added since (:data:`ADDED_SINCE_PRERELEASE`) are created,
    then its tables must be exactly the baseline's (else :class:`ConfigError` listing the
    differences, nothing changed); every ``inferplane_*`` function is dropped
    and the baseline's ``governance.sql`` and ``lease.sql`` installed; no row is touched
    (alembic then takes the database from the baseline to head). None
    when the database is not pre-release; a pre-release revision other than ``0009`` is
    refused with what to do."""
    import sql

    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        # The migrators' lock (migrations/env.py): a concurrent `mayu migrate` waits.
        conn.execute("SELECT pg_advisory_xact_lock(4651238117001)")
        heads = database_heads(conn)
        if not heads or not all(r in PRERELEASE_REVISIONS for r in heads):
            return None
        if heads != (_CONVERTIBLE,):
            raise ConfigError(f"database: schema at pre-release revision "
                              f"{', '.join(heads)}: {_PRERELEASE_HINT}")
        want = files_structure(conn, baseline=True)
        for name in ADDED_SINCE_PRERELEASE:
            conn.execute(sql.baseline_script(name))
        problems = _differences(structure(conn), want)
        if problems:
            raise ConfigError(
                "database: pre-release schema (revision 0009) does not match the 0.1.0 "
                "baseline, nothing was changed: " + "; ".join(problems[:10])
                + ("" if len(problems) <= 10 else f"; … {len(problems) - 10} more")
                + ". Restore the listed objects as revision 0009 defined them (or "
                "migrate a copy with inferplane commit cdf51f7), then run `mayu migrate`")
        conn.execute(sql.script("drop_functions"))
        conn.execute(sql.baseline_script("governance"))
        conn.execute(sql.baseline_script("lease"))
        conn.execute("UPDATE alembic_version SET version_num = %s", (BASELINE_REVISION,))
    return Step(revision=BASELINE_REVISION, down_revision=_CONVERTIBLE,
                doc="pre-release database converted to the 0.1.0 baseline (functions "
                    "replaced, every row kept)", seconds=time.monotonic() - started)


__all__ = ["BASELINE_REVISION", "MIGRATE_HINT", "PREVIOUS_FUNCTIONS", "Step", "check_dsn",
           "code_heads", "convert_prerelease", "database_heads", "database_heads_async",
           "describe_dsn", "files_structure", "schema_problem", "script_location",
           "structure", "upgrade"]
