"""Admission and settlement as _v2 functions: split into helpers, the request log written once.

Revision ID: v012_functions_v2
Revises: v011_console_sessions
Create Date: 2026-12-07

Creates the functions of ``0003_functions_v2.sql`` (frozen beside this file; the present
definitions are in ``sql/governance.sql``): the entry points ``inferplane_admit_one_v2``,
``inferplane_admit_v2``, ``inferplane_settle_one_v2``, ``inferplane_settle_v2``,
``inferplane_resolve_v2`` and ``inferplane_settle_admit_v2`` answer as their _v1 did, and
the settling ones take the request log's facts and write them
(``inferplane_write_facts_v2``). The _v1 entry points stay installed for one release,
for gateways of the previous release during a rolling update
(:data:`gateway.schema.PREVIOUS_FUNCTIONS`); the next release's first revision drops them.
"""

from __future__ import annotations

from pathlib import Path

from alembic import op

import sql

revision = "v012_functions_v2"
down_revision = "v011_console_sessions"
branch_labels = None
depends_on = None

_DROP_V2 = """
DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT oid::regprocedure FROM pg_proc
              WHERE starts_with(proname, 'inferplane_') AND right(proname, 3) = '_v2'
                AND pronamespace = current_schema()::regnamespace LOOP
        EXECUTE 'DROP FUNCTION ' || f;
    END LOOP;
END
$$;
"""


def upgrade() -> None:
    text = Path(__file__).with_name("0003_functions_v2.sql").read_text(encoding="utf-8")
    sql.run_script(op, "0003_functions_v2", text=text)


def downgrade() -> None:
    sql.run_script(op, "drop_v2", text=_DROP_V2)
