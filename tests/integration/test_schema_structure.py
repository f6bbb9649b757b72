"""The baseline revision plus every migration build exactly what the schema files define.

``sql/schema.sql``, ``sql/governance.sql`` and ``sql/lease.sql`` (``sql.SCHEMA``) hold the
present; the migrations hold how a database gets there (CONTRIBUTING.md). A change made
in one and not the other fails here: tables and columns (order, type, nullability,
default), indexes, constraints, functions (arguments, result, volatility, body,
settings) and views are compared.
"""

from __future__ import annotations

import psycopg
import pytest

import sql
from gateway.schema import PREVIOUS_FUNCTIONS, files_structure, structure

pytestmark = pytest.mark.integration


def test_migrations_equal_the_schema_files(pg_dsn: str, pg_empty_dsn: str) -> None:
    """A database built by alembic upgrade head and one built by installing the present
    sql files on an empty database have the same schema."""
    with psycopg.connect(pg_empty_dsn) as conn:
        for name in sql.SCHEMA:
            conn.execute(sql.script(name))
    with psycopg.connect(pg_dsn) as migrated_conn, psycopg.connect(pg_empty_dsn) as conn:
        migrated, from_files = structure(migrated_conn), structure(conn)
    migrated["functions"] = {f for f in migrated["functions"]
                             if f[0] not in PREVIOUS_FUNCTIONS}
    assert migrated.keys() == from_files.keys()
    for part in migrated:
        assert sorted(migrated[part] - from_files[part]) == [], part
        assert sorted(from_files[part] - migrated[part]) == [], part
    tables = {c[0] for c in migrated["columns"]}
    assert {"permits", "permit_facts", "key_rotations", "team_members",
            "console_sessions"} <= tables
    assert len(migrated["functions"]) > 20 and len(migrated["columns"]) > 100


def test_the_structure_sees_a_changed_function(pg_dsn: str) -> None:
    """A function redefined in place (the mistake the rule forbids) is a difference."""
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        conn.execute("CREATE OR REPLACE FUNCTION inferplane_now_us_v1() RETURNS bigint "
                     "LANGUAGE sql VOLATILE AS $$ SELECT 0::bigint $$")
        assert structure(conn)["functions"] != files_structure(conn)["functions"]


def test_the_structure_sees_a_table_left_out_of_the_files(pg_dsn: str) -> None:
    """A table a migration creates but sql/schema.sql lacks is a difference."""
    with psycopg.connect(pg_dsn) as conn, conn.transaction():
        conn.execute("CREATE TABLE inferplane_stray (id bigint PRIMARY KEY)")
        found, want = structure(conn), files_structure(conn)
    assert {c for c in found["columns"] if c[0] == "inferplane_stray"}
    assert found["columns"] - want["columns"] and found["indexes"] - want["indexes"]
