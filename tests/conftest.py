"""Postgres fixtures shared by every test suite (real server, never a mock).

- ``pg_server_dsn`` (session): the server, from ``INFERPLANE_TEST_PG_DSN`` (default
  ``postgresql://postgres@127.0.0.1:5432/postgres``).
- ``pg_template`` (session): a database migrated with the real ``alembic upgrade head``,
  used only as a template (its DSN is returned; never connect to it from a test, or the
  clone fails).
- ``pg_dsn`` (function): a fresh database cloned from the template
  (``CREATE DATABASE x TEMPLATE tpl``), dropped after the test; ``pg_module_dsn`` the same
  for one module (its module-scoped servers).

Database names carry the pid, so parallel runs on one server never collide.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from hypothesis import settings
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

ROOT = Path(__file__).resolve().parent.parent

# Property tests have no per-example deadline: the suite asserts no timings, and a
# loaded machine (CI shares two cores) must not fail a property for being slow.
settings.register_profile("inferplane", deadline=None, print_blob=True)
settings.load_profile("inferplane")

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
_counter = itertools.count()


def dsn_for(server_dsn: str, dbname: str) -> str:
    """The server DSN pointed at another database, as a ``postgresql://`` URL."""
    params = conninfo_to_dict(server_dsn)
    params["dbname"] = dbname
    user = params.get("user", "postgres")
    host = params.get("host", "127.0.0.1")
    port = params.get("port", "5432")
    password = f":{params['password']}" if params.get("password") else ""
    return f"postgresql://{user}{password}@{host}:{port}/{dbname}"


def create_database(server_dsn: str, name: str, *, template: str | None = None) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            pgsql.Identifier(name)))
        if template is None:
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
        else:
            conn.execute(pgsql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                pgsql.Identifier(name), pgsql.Identifier(template)))


def drop_database(server_dsn: str, name: str) -> None:
    # FORCE: a test that failed may leave a gateway's pooled connection behind.
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            pgsql.Identifier(name)))


def migrate(dsn: str, revision: str = "head", *, down: bool = False) -> None:
    """Run the real alembic migrations (``alembic.ini`` at the repo root) against ``dsn``."""
    from alembic import command
    from alembic.config import Config

    cfg = Config(str(ROOT / "alembic.ini"))
    previous = os.environ.get("INFERPLANE_DATABASE_URL")
    os.environ["INFERPLANE_DATABASE_URL"] = dsn
    try:
        if down:
            command.downgrade(cfg, revision)
        else:
            command.upgrade(cfg, revision)
    finally:
        if previous is None:
            os.environ.pop("INFERPLANE_DATABASE_URL", None)
        else:
            os.environ["INFERPLANE_DATABASE_URL"] = previous


@pytest.fixture(scope="session")
def pg_server_dsn() -> str:
    dsn = os.environ.get("INFERPLANE_TEST_PG_DSN", DEFAULT_DSN)
    make_conninfo(dsn)  # a malformed DSN fails here, naming the variable's value
    try:
        psycopg.connect(dsn, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        pytest.fail(f"INFERPLANE_TEST_PG_DSN={dsn}: Postgres is not reachable: {exc}")
    return dsn


@pytest.fixture(scope="session")
def pg_template(pg_server_dsn: str) -> Iterator[str]:
    name = f"ipt_tpl_{os.getpid()}"
    create_database(pg_server_dsn, name)
    try:
        migrate(dsn_for(pg_server_dsn, name))
        yield name
    finally:
        drop_database(pg_server_dsn, name)


@contextmanager
def cloned_database(server_dsn: str, template: str, suffix: str) -> Iterator[str]:
    """A database cloned from the migrated ``template`` (``ipt_<pid>_<suffix>``), as a
    ``postgresql://`` URL; dropped afterwards. Module-scoped fixtures name their own."""
    name = f"ipt_{os.getpid()}_{suffix}"
    create_database(server_dsn, name, template=template)
    try:
        yield dsn_for(server_dsn, name)
    finally:
        drop_database(server_dsn, name)


@pytest.fixture
def pg_dsn(pg_server_dsn: str, pg_template: str) -> Iterator[str]:
    """A fresh, migrated database for one test (``postgresql://`` URL)."""
    with cloned_database(pg_server_dsn, pg_template, str(next(_counter))) as dsn:
        yield dsn


@pytest.fixture(scope="module")
def pg_module_dsn(pg_server_dsn: str, pg_template: str) -> Iterator[str]:
    """A fresh, migrated database shared by one module's tests (its module-scoped stack)."""
    with cloned_database(pg_server_dsn, pg_template, f"m{next(_counter)}") as dsn:
        yield dsn


@pytest.fixture
def pg_empty_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A fresh, EMPTY database (not migrated), for migration tests."""
    name = f"ipt_{os.getpid()}_e{next(_counter)}"
    create_database(pg_server_dsn, name)
    try:
        yield dsn_for(pg_server_dsn, name)
    finally:
        drop_database(pg_server_dsn, name)


@pytest.fixture
async def pg_pool(pg_dsn: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """An open gateway pool (:func:`gateway.db.open_pool`) on a fresh migrated database.

    Its pool timeout is 10 s, not the product's 2 s: the contention tests hold every
    connection on one team's row locks, and on a loaded 2-core machine a wait for a
    connection passed 2 s (a PoolTimeout, not a wrong figure). Tests of the timeout
    itself open their own pool."""
    from gateway.config import DatabaseSettings
    from gateway.db import open_pool

    monkeypatch.setenv("INFERPLANE_DATABASE_URL", pg_dsn)
    pool = open_pool(DatabaseSettings(pool_min_size=1, pool_max_size=8, pool_timeout_s=10.0))
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()
