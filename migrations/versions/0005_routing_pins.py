"""Routing pins: which deployment each agent session is pinned to (cache affinity).

Revision ID: v014_routing_pins
Revises: v013_identity
Create Date: 2026-12-07

The shared profile's replicas share their cache-affinity pins (``routing.affinity``,
docs/routing.md): a session key (a hash: never a payload) per model, the deployment
whose prompt cache it warmed, and until when. The present definition is in
``sql/schema.sql``.
"""

from __future__ import annotations

from migrations.steps import sql_steps

revision = "v014_routing_pins"
down_revision = "v013_identity"
branch_labels = None
depends_on = None

_UP = """
CREATE TABLE routing_pins (model text NOT NULL, session_key text NOT NULL,
    deployment text NOT NULL, expires_at timestamptz NOT NULL,
    PRIMARY KEY (model, session_key));
CREATE INDEX routing_pins_expires_idx ON routing_pins (expires_at);
"""

upgrade, downgrade = sql_steps(up=_UP, down="DROP TABLE routing_pins")
