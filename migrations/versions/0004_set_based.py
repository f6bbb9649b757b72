"""Set-based admission and settlement: inferplane_admit_v3, _settle_v3, _settle_admit_v3.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Installs ``sql/admit_v3.sql`` and ``sql/settle_v3.sql`` (issue 11, docs/hot-team.md):
the same contracts, arithmetic and lock order as the ``_v2`` functions, deciding a
whole batch with a fixed number of statements; and ``sql/batch_v3.sql``, the two in one
transaction (settlements, then admissions). Additive: no table changes, and the
``_v1``/``_v2`` functions stay installed and unchanged, so a gateway of the previous
release keeps working against this schema during a rolling upgrade and an upgrade moves
no figure; ``downgrade`` drops exactly the five functions.
"""

from __future__ import annotations

from alembic import op

import sql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_FUNCTIONS = ("inferplane_settle_admit_v3(jsonb, json)", "inferplane_admit_v3(json)",
              "inferplane_snapshot_v3(json)", "inferplane_settle_v3(jsonb)",
              "inferplane_lock_rows_v3(text[], text[])")


def _run_script(text: str) -> None:
    # Same as 0001: whole files go straight to the driver (PL/pgSQL bodies hold ':=').
    if op.get_context().as_sql:
        op.execute(text)
        return
    op.get_bind().exec_driver_sql(text)


def upgrade() -> None:
    for name in ("admit_v3", "settle_v3", "batch_v3"):
        _run_script(sql.script(name))


def downgrade() -> None:
    for fn in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {fn}")
