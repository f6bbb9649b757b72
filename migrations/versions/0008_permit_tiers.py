"""Permit tiers: which tier served a request-log row (the soft tier of routing).

Revision ID: v017_permit_tiers
Revises: v016_agent_usage
Create Date: 2026-12-07

A caller past a soft budget is served by its model's cheaper tier
(``models[].routing.soft_tier``, docs/routing.md); the request log says so per permit.
Only the soft tier is written (no row: the model's usual deployments), by a statement
of its own after the settlement, so the settlement functions are unchanged. The present
definition is in ``sql/schema.sql``.
"""

from __future__ import annotations

from migrations.steps import sql_steps

revision = "v017_permit_tiers"
down_revision = "v016_agent_usage"
branch_labels = None
depends_on = None

_UP = """
CREATE TABLE permit_tiers (permit_id uuid PRIMARY KEY, tier text NOT NULL);
"""

upgrade, downgrade = sql_steps(up=_UP, down="DROP TABLE permit_tiers")
