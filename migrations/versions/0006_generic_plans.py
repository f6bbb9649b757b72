"""Plans made once per session, and a lone settlement in fewer statements: the _v5 calls.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

Installs ``sql/plans_v5.sql`` (issue 11): the v4 calls with ``plan_cache_mode =
force_generic_plan`` for the call, so no statement of a batch is planned again on every
call, and ``inferplane_settle_one_v5``, ``inferplane_settle_v2`` for one permit with its
per-segment loop made set-based (the file says why and what was measured). Additive: no
table changes and no function changed, so a gateway of the previous release keeps
working against this schema during a rolling upgrade and an upgrade moves no figure;
``downgrade`` drops exactly the six functions.
"""

from __future__ import annotations

from alembic import op

import sql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_FUNCTIONS = ("inferplane_admit_v5(json)", "inferplane_admit_one_v5(jsonb)",
              "inferplane_settle_v5(jsonb)", "inferplane_settle_one_v5(uuid, jsonb)",
              "inferplane_resolve_v5(uuid, jsonb)",
              "inferplane_settle_admit_v5(jsonb, json)")


def upgrade() -> None:
    # Same as 0001: whole files go straight to the driver (PL/pgSQL bodies hold ':=').
    text = sql.script("plans_v5")
    if op.get_context().as_sql:
        op.execute(text)
    else:
        op.get_bind().exec_driver_sql(text)


def downgrade() -> None:
    for fn in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {fn}")
