"""Lone calls: a settlement that locks its counters last, an admission with fewer
statements (``inferplane_settle_one_v7``, ``inferplane_admit_one_v7``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

Installs ``sql/plans_v7.sql`` (issue 11): ``inferplane_settle_one_v7``, the v5 lone
settlement with the permit's segments read once, and its segments and permit row written
before its accounts and counters are locked, so the next admission on the same team (a
client's next request, at concurrency 1) waits only for the counter arithmetic and the
commit; and ``inferplane_admit_one_v7``, the v5 lone admission without its account
statements for a request that charges no account and with the permit written inline.
Additive: no table changes and no function changed, so a gateway of the previous
release keeps working against this schema during a rolling upgrade and an upgrade moves
no figure; ``downgrade`` drops exactly the two functions.
"""

from __future__ import annotations

from alembic import op

import sql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_FUNCTIONS = ("inferplane_settle_one_v7(uuid, jsonb)", "inferplane_admit_one_v7(jsonb)")


def upgrade() -> None:
    # Same as 0001: whole files go straight to the driver (PL/pgSQL bodies hold ':=').
    text = sql.script("plans_v7")
    if op.get_context().as_sql:
        op.execute(text)
    else:
        op.get_bind().exec_driver_sql(text)


def downgrade() -> None:
    for fn in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {fn}")
