"""Agents' own usage reports: what Claude Code and Codex say they used, never billed.

Revision ID: v016_agent_usage
Revises: v015_request_log_planes
Create Date: 2026-12-07

The gateway's OTLP receiver (``POST /v1/logs``, ``/v1/metrics``: gateway/otlp_import)
stores the usage an agent exports about itself beside the request log, one row per
reported event (idempotent on its ``event_id``), so the usage API can set it beside
what the gateway committed (a large gap is traffic that bypassed the gateway). No
counter, permit or account reads it. The present definition is in ``sql/schema.sql``.
"""

from __future__ import annotations

from migrations.steps import sql_steps

revision = "v016_agent_usage"
down_revision = "v015_request_log_planes"
branch_labels = None
depends_on = None

_UP = """
CREATE TABLE client_usage_reports (event_id text PRIMARY KEY, team_id text NOT NULL,
    key_id text NOT NULL, user_name text, agent text NOT NULL,
    signal text NOT NULL CHECK (signal IN ('event', 'metric')), session_id text,
    model text, input_tokens bigint NOT NULL CHECK (input_tokens >= 0),
    output_tokens bigint NOT NULL CHECK (output_tokens >= 0),
    cache_read_tokens bigint NOT NULL CHECK (cache_read_tokens >= 0),
    cache_write_tokens bigint NOT NULL CHECK (cache_write_tokens >= 0),
    reported_cost_uusd bigint CHECK (reported_cost_uusd >= 0),
    reported_at timestamptz NOT NULL, received_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX client_usage_reports_team_idx ON client_usage_reports (team_id, reported_at);
CREATE INDEX client_usage_reports_key_idx ON client_usage_reports (key_id, reported_at);
"""

upgrade, downgrade = sql_steps(up=_UP, down="DROP TABLE client_usage_reports")
