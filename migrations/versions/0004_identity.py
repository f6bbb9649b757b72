"""Identity: a user keeps the OIDC issuer and subject it signed in as; brokered keys.

Revision ID: v013_identity
Revises: v012_functions_v2
Create Date: 2026-12-07

``users.issuer``/``users.subject`` bind a user to one person at one issuer (a renamed
email is the same person); ``users.revoked_at`` refuses their brokered credentials and
new exchanges. ``keys.brokered`` marks the key inferplaned keeps per user and team for
the credentials it issues (at most one active per user and team). The present
definition is in ``sql/schema.sql``.
"""

from __future__ import annotations

from migrations.steps import sql_steps

revision = "v013_identity"
down_revision = "v012_functions_v2"
branch_labels = None
depends_on = None

_UP = """
ALTER TABLE users ADD COLUMN issuer text, ADD COLUMN subject text,
                  ADD COLUMN revoked_at timestamptz;
CREATE UNIQUE INDEX users_identity_idx ON users (issuer, subject) WHERE issuer IS NOT NULL;
ALTER TABLE keys ADD COLUMN brokered boolean NOT NULL DEFAULT false;
CREATE UNIQUE INDEX keys_brokered_idx ON keys (team_id, user_name)
    WHERE brokered AND revoked_at IS NULL;
"""

upgrade, downgrade = sql_steps(
    up=_UP,
    down="DROP INDEX keys_brokered_idx; ALTER TABLE keys DROP COLUMN brokered; "
         "DROP INDEX users_identity_idx; ALTER TABLE users DROP COLUMN issuer, "
         "DROP COLUMN subject, DROP COLUMN revoked_at")
