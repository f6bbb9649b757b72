"""The baseline revision plus every migration build exactly what the schema files define.

``sql/schema.sql``, ``sql/governance.sql`` and ``sql/lease.sql`` hold the present; the
migrations hold how a database gets there (CONTRIBUTING.md). A change made in one and
not the other fails here: columns (order, type, nullability, default), indexes,
constraints and functions (arguments, body, settings) are compared.
"""

from __future__ import annotations

import psycopg
import pytest

from gateway.schema import PREVIOUS_FUNCTIONS, files_structure, structure

pytestmark = pytest.mark.integration


def test_migrations_equal_the_schema_files(pg_dsn: str) -> None:
    """alembic upgrade head and the schema files give the same structure."""
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        migrated = structure(conn)
        from_files = files_structure(conn)
    migrated["functions"] = {f for f in migrated["functions"]
                             if f[0] not in PREVIOUS_FUNCTIONS}
    for part in ("columns", "indexes", "constraints", "functions"):
        assert migrated[part] == from_files[part], part
    assert len(migrated["functions"]) > 20 and len(migrated["columns"]) > 100


def test_the_structure_sees_a_changed_function(pg_dsn: str) -> None:
    """A function redefined in place (the mistake the rule forbids) is a difference."""
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        conn.execute("CREATE OR REPLACE FUNCTION inferplane_now_us_v1() RETURNS bigint "
                     "LANGUAGE sql VOLATILE AS $$ SELECT 0::bigint $$")
        assert structure(conn)["functions"] != files_structure(conn)["functions"]
