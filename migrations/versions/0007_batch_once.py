"""A batch parsed once and sorted once per statement: the _v6 batch calls.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

Installs ``sql/plans_v6.sql`` (issue 11): ``inferplane_admit_v6``, ``_settle_v6`` and
``_settle_admit_v6``, the v5 batch calls with the requests as jsonb (parsed once, not by
each statement), one sort per statement instead of one per aggregated array, and a
merged batch's snapshots checked once (the file says why and what was measured), with
their helpers. Additive: no table changes and no function changed, so a gateway of the
previous release keeps working against this schema during a rolling upgrade and an
upgrade moves no figure; ``downgrade`` drops exactly the five functions.
"""

from __future__ import annotations

from alembic import op

import sql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_FUNCTIONS = ("inferplane_settle_admit_v6(jsonb, jsonb)", "inferplane_settle_v6(jsonb)",
              "inferplane_admit_v6(jsonb)", "inferplane_admit_checked_v6(jsonb, jsonb[])",
              "inferplane_snapshot_v6(jsonb)")


def upgrade() -> None:
    # Same as 0001: whole files go straight to the driver (PL/pgSQL bodies hold ':=').
    text = sql.script("plans_v6")
    if op.get_context().as_sql:
        op.execute(text)
    else:
        op.get_bind().exec_driver_sql(text)


def downgrade() -> None:
    for fn in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {fn}")
