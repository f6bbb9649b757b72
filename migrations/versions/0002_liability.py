"""Schema v2: liability beside committed and reserved; admit/settle/resolve _v2 functions.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Adds the liability columns (existing rows start at 0, so every committed figure is kept),
the ``alert_events`` table of budget alerts (ADR-050) and the indexes the cluster-wide
gauges read by, and installs ``inferplane_admit_v2`` / ``inferplane_settle_v2`` /
``inferplane_resolve_v2`` beside the frozen ``_v1`` functions, which stay installed and
unchanged.
"""

from __future__ import annotations

from alembic import op

import sql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_V2_FUNCTIONS = ("inferplane_admit_v2(jsonb)", "inferplane_check_charge_v2(jsonb, bigint)",
                 "inferplane_resolve_v2(uuid, jsonb)", "inferplane_settle_v2(uuid, jsonb)",
                 "inferplane_settle_result_v2(permits, boolean)",
                 "inferplane_record_v2(uuid, jsonb, boolean)",
                 "inferplane_lock_segments_v2(uuid)",
                 "inferplane_check_parts_v2(uuid, jsonb)")


def _run_script(text: str) -> None:
    # Same as 0001: whole files go straight to the driver (PL/pgSQL bodies hold ':=').
    if op.get_context().as_sql:
        op.execute(text)
        return
    op.get_bind().exec_driver_sql(text)


def upgrade() -> None:
    for name in ("schema_v2", "admit_v2", "settle_v2"):
        _run_script(sql.script(name))


def downgrade() -> None:
    op.execute("DROP TABLE alert_events")
    for index in ("counters_usd_window_idx", "counters_frozen_idx",
                  "authority_accounts_window_idx", "authority_accounts_frozen_idx"):
        op.execute(f"DROP INDEX {index}")
    for fn in _V2_FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {fn}")
    op.execute("ALTER TABLE permit_segments DROP COLUMN liability")
    op.execute("ALTER TABLE teams DROP COLUMN budget_fit_floor")
    for column in ("resolved_at", "bound_exceeded", "usd_liability", "tokens_liability"):
        op.execute(f"ALTER TABLE permits DROP COLUMN {column}")
    op.execute("ALTER TABLE authority_accounts DROP COLUMN liability")
    op.execute("ALTER TABLE counters DROP COLUMN liability")
