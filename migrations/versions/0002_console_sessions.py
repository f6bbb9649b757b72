"""Console sessions: a signed-in console visitor's session, kept in the shared database.

Revision ID: v011_console_sessions
Revises: v010_baseline
Create Date: 2026-12-07

The console's cookie carries a random session id; the table keeps only its sha256 and
the sha256 of the credential signed in with, so a database read reveals neither. Every
replica reads the same row: a sign-out or a revoked credential ends the session
everywhere. The present definition is in ``sql/schema.sql``.
"""

from __future__ import annotations

from migrations.steps import sql_steps

revision = "v011_console_sessions"
down_revision = "v010_baseline"
branch_labels = None
depends_on = None

_CREATE = """
CREATE TABLE console_sessions (
    id_sha256         bytea PRIMARY KEY,   -- sha256 of the random session id the cookie carries
    subject           text NOT NULL,       -- 'admin:<token name>' or 'key:<key id>'
    access            text NOT NULL CHECK (access IN ('write', 'read', 'key')),
    credential_sha256 bytea NOT NULL,      -- sha256 of the credential signed in with
    created_at        timestamptz NOT NULL DEFAULT now(),
    last_seen_at      timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL, -- absolute expiry
    ended_at          timestamptz           -- set by sign-out or revocation
);
CREATE INDEX console_sessions_credential_idx ON console_sessions (credential_sha256);
CREATE INDEX console_sessions_subject_idx ON console_sessions (subject);
"""

upgrade, downgrade = sql_steps(up=_CREATE, down="DROP TABLE console_sessions")
