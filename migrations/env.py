"""alembic environment: the database URL comes from ``INFERPLANE_DATABASE_URL``.

The URL is the plain libpq form the gateway uses (``postgresql://...``); SQLAlchemy needs
its psycopg 3 driver spelled out, so it is rewritten to ``postgresql+psycopg://``. A
multi-host URL (``postgresql://u@h1:p1,h2:p2/db?target_session_attrs=read-write``, an HA
cluster: docs/failover.md), which SQLAlchemy cannot parse, is rewritten to the
equivalent query form (``?host=h1,h2&port=p1,p2``).
Migrations are raw SQL (the schema has no ORM models), so there is no metadata to
autogenerate from.

``mayu migrate`` (:func:`gateway.schema.upgrade`) drives this same file programmatically:
it sets ``sqlalchemy.url`` and passes a progress callback as the config attribute
``on_version_apply``. Online runs take a transaction-scoped advisory lock first, so two
concurrent migrators (two Jobs, a Job and an operator) run one after the other.
"""

from __future__ import annotations

import os
from urllib.parse import quote, urlencode, urlsplit

from alembic import context
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import create_engine, pool, text

from gateway.errors import ConfigError

URL_ENV = "INFERPLANE_DATABASE_URL"
# Any fixed 64-bit key: it only has to be the same for every migrator of this schema.
_MIGRATION_LOCK = 4_651_238_117_001


def sqlalchemy_url() -> str:
    url = context.config.get_main_option("sqlalchemy.url") or os.environ.get(URL_ENV)
    if not url:
        raise ConfigError(f"{URL_ENV}: not set (the Postgres URL to migrate)")
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + _hosts_in_query(url)[len(prefix):]
    return url


def _hosts_in_query(url: str) -> str:
    """A libpq URL naming several hosts in its authority, with them moved to the query
    (the same connection for libpq; a form SQLAlchemy reads). Any other URL as is."""
    if "," not in urlsplit(url).netloc.rpartition("@")[2]:
        return url
    params = {k: str(v) for k, v in conninfo_to_dict(url).items()}
    user = quote(params.pop("user", ""), safe="")
    password = params.pop("password", None)
    if password is not None:
        user += ":" + quote(password, safe="")
    dbname = quote(params.pop("dbname", ""), safe="")
    scheme = url.split("://", 1)[0]
    return f"{scheme}://{user}@/{dbname}?{urlencode(params)}"


def run_offline() -> None:
    context.configure(url=sqlalchemy_url(), literal_binds=True, transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    # NullPool: no connection outlives the migration (a template database must have none).
    engine = create_engine(sqlalchemy_url(), poolclass=pool.NullPool)
    progress = context.config.attributes.get("on_version_apply")
    with engine.connect() as connection:
        context.configure(connection=connection, transactional_ddl=True,
                          on_version_apply=progress)
        with context.begin_transaction():
            # Before alembic reads the current revision: a second migrator waits here,
            # then finds the work done.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                               {"key": _MIGRATION_LOCK})
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
