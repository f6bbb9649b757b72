"""The durable lease ledger (lease_dataplanes, lease_grants, inferplane_lease_*_v1).

ADR-034 §2 and DESIGN §6: the ledger rows sit beside the authority accounts they share
with shared-profile admission.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Additive: no existing table or function changes, so an upgrade moves no figure of any
account; ``downgrade`` drops exactly what ``upgrade`` created.
"""

from __future__ import annotations

from alembic import op

import sql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_FUNCTIONS = ("inferplane_lease_sync_v1(jsonb)",
              "inferplane_lease_apply_v1(jsonb, text, text, boolean, timestamptz)",
              "inferplane_lease_stored_v1(jsonb, text)",
              "inferplane_lease_lock_v1(jsonb, text)",
              "inferplane_lease_dataplanes_v1()")


def _run_script(text: str) -> None:
    # Same as 0001: whole files go straight to the driver (PL/pgSQL bodies hold ':=').
    if op.get_context().as_sql:
        op.execute(text)
        return
    op.get_bind().exec_driver_sql(text)


def upgrade() -> None:
    _run_script(sql.script("lease_v1"))


def downgrade() -> None:
    for fn in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {fn}")
    op.execute("DROP TABLE IF EXISTS lease_grants")
    op.execute("DROP TABLE IF EXISTS lease_dataplanes")
