"""Batch admissions that write their permits before they lock their counters
(``inferplane_admit_v8``), and batch settlements without an empty accounts UPDATE
(``inferplane_settle_v8``).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

Installs ``sql/plans_v8.sql`` (issue 11): ``inferplane_admit_v8`` and its body
``inferplane_admit_checked_v8``, v6's batch admission with every snapshot-current
request's permit and segments inserted before the accounts and counters are locked (a
refused request's rows deleted again in the same transaction), so one hot team's counter
rows are held for the decisions, the counter writes and the commit only; and
``inferplane_settle_v8``, v6's batch settlement whose accounts UPDATE (inside the
counter locks) runs only when an account was locked. Additive: no table changes and no
function changed, so a gateway of the previous release keeps
working against this schema during a rolling upgrade and an upgrade moves no figure;
``downgrade`` drops exactly the three functions.
"""

from __future__ import annotations

from alembic import op

import sql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_FUNCTIONS = ("inferplane_admit_v8(jsonb)", "inferplane_admit_checked_v8(jsonb, jsonb[])",
              "inferplane_settle_v8(jsonb)")


def upgrade() -> None:
    # Same as 0001: whole files go straight to the driver (PL/pgSQL bodies hold ':=').
    text = sql.script("plans_v8")
    if op.get_context().as_sql:
        op.execute(text)
    else:
        op.get_bind().exec_driver_sql(text)


def downgrade() -> None:
    for fn in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {fn}")
