"""The request log of every lease plane: a plane column on permits.

Revision ID: v015_request_log_planes
Revises: v014_routing_pins
Create Date: 2026-12-07

Lease-profile planes ship each settled request's usage record to inferplaned
(``POST /v1alpha1/usage``, docs/lease.md), which stores it in the same request log the
shared profile writes (``permits`` and ``permit_facts``), marked with the plane it came
from; a permit the shared profile admitted has none. The present definition is in
``sql/schema.sql``.
"""

from __future__ import annotations

from migrations.steps import sql_steps

revision = "v015_request_log_planes"
down_revision = "v014_routing_pins"
branch_labels = None
depends_on = None

_UP = """
ALTER TABLE permits ADD COLUMN plane text;
CREATE INDEX permits_plane_created_idx ON permits (plane, created_at)
    WHERE plane IS NOT NULL;
"""

upgrade, downgrade = sql_steps(
    up=_UP, down="DROP INDEX permits_plane_created_idx; ALTER TABLE permits DROP COLUMN plane")
