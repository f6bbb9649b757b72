"""The 0.1.0 baseline: every table, index and function of the shared and lease profiles.

Revision ID: v010_baseline
Revises:
Create Date: 2026-12-04

Installs the six files 0.1.0 released, frozen in ``migrations/baseline/`` (``schema``,
``key_rotations``, ``members``, ``request_log``, ``governance``, ``lease``; pinned by
``sql.BASELINE_SHA256``), never the present ``sql/`` files.
Every later change is a new revision on top of this one (CONTRIBUTING.md); a
database created by a pre-release build (revision ``0009``) is converted to this revision by
``mayu migrate`` (:func:`gateway.schema.convert_prerelease`), not by alembic.
"""

from __future__ import annotations

from alembic import op

import sql

revision = "v010_baseline"
down_revision = None
branch_labels = None
depends_on = None

# Dependents first.
_TABLES = ("permit_facts", "team_members", "users", "key_rotations", "lease_grants",
           "lease_dataplanes", "alert_events", "permit_segments", "permits",
           "authority_accounts", "counters", "policy_changes", "policy_generations",
           "policy_state", "bootstrap_declarations", "keys", "teams", "authority_namespace")


def upgrade() -> None:
    for name in sql.BASELINE:
        sql.run_script(op, name, text=sql.baseline_script(name))


def downgrade() -> None:
    sql.run_script(op, "drop_functions")
    for table in _TABLES:
        op.execute(f"DROP TABLE IF EXISTS {table}")
