"""Shared governance schema v1: tables, admission and settlement functions (ADR-046).

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

import sql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_TABLES = ("permit_segments", "permits", "authority_accounts", "counters", "policy_changes",
           "policy_generations", "policy_state", "bootstrap_declarations", "keys", "teams",
           "authority_namespace")
# Every function of this schema is named inferplane_*: downgrade drops them all.
_DROP_FUNCTIONS = """
DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT oid::regprocedure FROM pg_proc
              WHERE starts_with(proname, 'inferplane_')
                AND pronamespace = current_schema()::regnamespace LOOP
        EXECUTE 'DROP FUNCTION ' || f;
    END LOOP;
END
$$
"""


def _run_script(text: str) -> None:
    # Whole files (several statements, PL/pgSQL bodies with ':=' and '%') go straight to
    # the driver: SQLAlchemy's text() would parse ':name' as bind parameters.
    if op.get_context().as_sql:
        op.execute(text)
        return
    op.get_bind().exec_driver_sql(text)


def upgrade() -> None:
    for name in ("schema_v1", "admit_v1", "settle_v1"):
        _run_script(sql.script(name))


def downgrade() -> None:
    _run_script(_DROP_FUNCTIONS)
    for table in _TABLES:
        op.execute(f"DROP TABLE IF EXISTS {table}")
