"""Plans that do not depend on table size: the inferplane_*_v4 calls.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

Installs ``sql/plans_v4.sql`` (issue 11): admission, settlement, resolution and the
merged batch as the v2/v3 functions decide them, each run with ``enable_seqscan`` and
``jit`` off for the call, so the plans a session caches while the tables are small stay
index plans as permits and segments grow (the file says why and what was measured).
Additive: no table changes and no function changed, so a gateway of the previous release
keeps working against this schema during a rolling upgrade and an upgrade moves no
figure; ``downgrade`` drops exactly the six functions.
"""

from __future__ import annotations

from alembic import op

import sql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_FUNCTIONS = ("inferplane_admit_v4(json)", "inferplane_admit_one_v4(jsonb)",
              "inferplane_settle_v4(jsonb)", "inferplane_settle_one_v4(uuid, jsonb)",
              "inferplane_resolve_v4(uuid, jsonb)",
              "inferplane_settle_admit_v4(jsonb, json)")


def upgrade() -> None:
    # Same as 0001: whole files go straight to the driver (PL/pgSQL bodies hold ':=').
    text = sql.script("plans_v4")
    if op.get_context().as_sql:
        op.execute(text)
    else:
        op.get_bind().exec_driver_sql(text)


def downgrade() -> None:
    for fn in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {fn}")
