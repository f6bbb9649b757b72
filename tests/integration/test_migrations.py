"""The alembic migrations build, remove and rebuild the whole shared schema."""

from __future__ import annotations

import psycopg

from tests.conftest import migrate

TABLES = {"authority_namespace", "teams", "keys", "bootstrap_declarations", "policy_state",
          "policy_generations", "policy_changes", "counters", "authority_accounts",
          "permits", "permit_segments", "lease_dataplanes", "lease_grants"}


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                            "AND tablename <> 'alembic_version'").fetchall()
    return {r[0] for r in rows}


def _functions(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'inferplane%'")
        return {r[0] for r in rows.fetchall()}


def test_empty_to_head_to_base_to_head(pg_empty_dsn: str) -> None:
    """upgrade head creates every table and function; downgrade base removes them all."""
    migrate(pg_empty_dsn)
    assert _tables(pg_empty_dsn) == TABLES
    assert {"inferplane_admit_v1", "inferplane_settle_v1",
            "inferplane_lease_sync_v1"} <= _functions(pg_empty_dsn)
    migrate(pg_empty_dsn, "base", down=True)
    assert _tables(pg_empty_dsn) == set()
    assert _functions(pg_empty_dsn) == set()
    migrate(pg_empty_dsn)
    assert _tables(pg_empty_dsn) == TABLES


def test_head_seeds_singletons(pg_dsn: str) -> None:
    """A migrated database has one authority namespace and policy generation 0."""
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM authority_namespace").fetchone() == (1,)
        assert conn.execute("SELECT generation FROM policy_state").fetchone() == (0,)
