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
_FUNCTIONS = (
    "inferplane_settle_v1(uuid, text, text, jsonb, text, bigint, bigint)",
    "inferplane_admit_v1(jsonb)",
    "inferplane_write_permit_v1(jsonb)",
    "inferplane_reserve_charge_v1(jsonb, bigint)",
    "inferplane_check_charge_v1(jsonb, bigint)",
    "inferplane_lock_charge_v1(jsonb, bigint)",
    "inferplane_check_snapshot_v1(jsonb, bigint)",
    "inferplane_now_us_v1()",
    "inferplane_retry_after_v1(bigint, bigint, bigint)",
    "inferplane_refill_v1(bigint, bigint, bigint)",
)


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
    for signature in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
    for table in _TABLES:
        op.execute(f"DROP TABLE IF EXISTS {table}")
