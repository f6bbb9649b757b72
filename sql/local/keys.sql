-- The local profile's key store in SQLite (gateway/keys/_sqlite.py): teams and their
-- keys, a key kept as its SHA-256 and a display prefix, never as plaintext.
-- Each statement starts with a "-- name: <name>" line; parameters are :name (sqlite3).
-- "schema" is run with executescript when the store opens (gateway/localdb.py).
-- The schema is the present one only: a file created by a pre-release build whose
-- tables lack one of these columns is refused when the store opens, naming the table
-- and the columns (gateway/localdb.py); nothing is altered in place.

-- name: schema
CREATE TABLE IF NOT EXISTS teams (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    rpm INTEGER, tpm INTEGER, tokens_per_day INTEGER,
    usd_micros_per_day INTEGER, usd_micros_per_month INTEGER,
    budget_fit_floor INTEGER,
    region TEXT,
    guardrails TEXT NOT NULL DEFAULT '[]',   -- JSON list of guardrail names
    revision INTEGER NOT NULL DEFAULT 1,     -- bumped by every edit
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS keys (
    id TEXT PRIMARY KEY,
    team_id TEXT NOT NULL REFERENCES teams(id),
    key_hash TEXT NOT NULL UNIQUE,
    display_prefix TEXT NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    user TEXT,
    allowed_models TEXT,                     -- JSON list; NULL: every model
    rpm INTEGER, tpm INTEGER, usd_micros_per_day INTEGER, usd_micros_per_month INTEGER,
    expires_at TEXT,
    revoked_at TEXT,                         -- a tombstone: the row is never deleted
    revision INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS keys_team ON keys(team_id);
-- Key rotations (the Postgres table's twin, sql/schema.sql): the secret a rotation
-- replaced works until old_valid_until; a retry with the same Idempotency-Key re-derives
-- the new secret from salt.
CREATE TABLE IF NOT EXISTS key_rotations (
    key_id TEXT NOT NULL REFERENCES keys(id),
    revision INTEGER NOT NULL,
    old_key_hash TEXT NOT NULL UNIQUE,
    old_valid_until TEXT NOT NULL,
    new_key_hash TEXT NOT NULL,
    idempotency_hash TEXT,
    salt TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (key_id, revision)
);
CREATE UNIQUE INDEX IF NOT EXISTS key_rotations_idempotency
    ON key_rotations(key_id, idempotency_hash) WHERE idempotency_hash IS NOT NULL;
-- Member and user budgets (the Postgres tables' twins, sql/schema.sql): a user's budget
-- within a team (user '*': the team's default member budget) and across every team.
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY,
    email TEXT, display_name TEXT,
    tokens_per_day INTEGER, usd_micros_per_day INTEGER, usd_micros_per_month INTEGER,
    revision INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS team_members (
    team_id TEXT NOT NULL REFERENCES teams(id),
    user_name TEXT NOT NULL,
    tokens_per_day INTEGER, usd_micros_per_day INTEGER, usd_micros_per_month INTEGER,
    revision INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
    PRIMARY KEY (team_id, user_name)
);
CREATE INDEX IF NOT EXISTS keys_user ON keys(user) WHERE user IS NOT NULL;
-- Console sessions (the Postgres table's twin, console_sessions; gateway/keys/_sessions.py):
-- a session by the SHA-256 of its id, the credential it was made with by its SHA-256 only.
-- Times are ISO-8601 UTC text of one width (microseconds always), so their order is the
-- time order.
CREATE TABLE IF NOT EXISTS console_sessions (
    id_sha256 BLOB PRIMARY KEY,
    subject TEXT NOT NULL,                   -- 'admin:<token name>' or 'key:<key id>'
    access TEXT NOT NULL CHECK (access IN ('write', 'read', 'key')),
    credential_sha256 BLOB NOT NULL,
    created_at TEXT NOT NULL,
    last_seen_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    ended_at TEXT
);
CREATE INDEX IF NOT EXISTS console_sessions_credential ON console_sessions(credential_sha256);
CREATE INDEX IF NOT EXISTS console_sessions_subject ON console_sessions(subject);

-- name: find_team
-- A team by id or by name (the id wins when one team's name is another's id).
SELECT * FROM teams WHERE id = :name_or_id OR name = :name_or_id
 ORDER BY id = :name_or_id DESC LIMIT 1

-- name: team
SELECT * FROM teams WHERE id = :id

-- name: teams
SELECT * FROM teams ORDER BY name

-- name: insert_team
INSERT INTO teams (id, name, rpm, tpm, tokens_per_day, usd_micros_per_day,
                   usd_micros_per_month, budget_fit_floor, region, guardrails, revision,
                   created_at)
VALUES (:id, :name, :rpm, :tpm, :tokens_per_day, :usd_micros_per_day,
        :usd_micros_per_month, :budget_fit_floor, :region, :guardrails, 1, :created_at)

-- name: update_team
-- A team's limits and guardrail profiles (a JSON list), as a whole; the revision moves.
UPDATE teams
   SET rpm = :rpm, tpm = :tpm, tokens_per_day = :tokens_per_day,
       usd_micros_per_day = :usd_micros_per_day,
       usd_micros_per_month = :usd_micros_per_month,
       budget_fit_floor = :budget_fit_floor, guardrails = :guardrails,
       revision = revision + 1
 WHERE id = :id

-- name: key_by_hash
SELECT * FROM keys WHERE key_hash = :key_hash

-- name: key
SELECT * FROM keys WHERE id = :id

-- name: keys
-- Every key, or one team's (:team_id not NULL); revoked ones only if :include_revoked.
SELECT * FROM keys
 WHERE (:team_id IS NULL OR team_id = :team_id)
   AND (:include_revoked OR revoked_at IS NULL)
 ORDER BY created_at, id

-- name: insert_key
INSERT INTO keys (id, team_id, key_hash, display_prefix, name, user, allowed_models, rpm,
                  tpm, usd_micros_per_day, usd_micros_per_month, expires_at, revoked_at,
                  revision, created_at)
VALUES (:id, :team_id, :key_hash, :display_prefix, :name, :user, :allowed_models, :rpm,
        :tpm, :usd_micros_per_day, :usd_micros_per_month, :expires_at, NULL, 1,
        :created_at)

-- name: update_key
UPDATE keys SET name = :name, user = :user, allowed_models = :allowed_models, rpm = :rpm,
       tpm = :tpm, usd_micros_per_day = :usd_micros_per_day,
       usd_micros_per_month = :usd_micros_per_month, expires_at = :expires_at,
       revision = revision + 1
 WHERE id = :id

-- name: revoke_key
UPDATE keys SET revoked_at = :revoked_at, revision = revision + 1 WHERE id = :id

-- name: rotated_key
-- A secret a rotation replaced: its key id and until when it works.
SELECT key_id, old_valid_until FROM key_rotations WHERE old_key_hash = :key_hash

-- name: key_rotation_by_idempotency
SELECT * FROM key_rotations WHERE key_id = :key_id AND idempotency_hash = :idempotency_hash

-- name: rotate_key
UPDATE keys SET key_hash = :key_hash, display_prefix = :display_prefix,
       revision = revision + 1
 WHERE id = :id

-- name: end_replaced_secrets
-- A new rotation ends the grace every earlier rotation left running, so a key has at
-- most two working secrets: its current one and the one this rotation replaces.
-- (ISO-8601 UTC text from one formatter: its order is the time order.)
UPDATE key_rotations SET old_valid_until = :now
 WHERE key_id = :key_id AND old_valid_until > :now

-- name: insert_key_rotation
INSERT INTO key_rotations (key_id, revision, old_key_hash, old_valid_until, new_key_hash,
                           idempotency_hash, salt, created_at)
VALUES (:key_id, :revision, :old_key_hash, :old_valid_until, :new_key_hash,
        :idempotency_hash, :salt, :created_at)

-- name: member_budget
-- A user's member row in a team, else the team's default ('*').
SELECT * FROM team_members
 WHERE team_id = :team_id AND user_name IN (:user_name, '*')
 ORDER BY user_name = '*' LIMIT 1

-- name: members
SELECT * FROM team_members WHERE team_id = :team_id ORDER BY user_name

-- name: member
SELECT * FROM team_members WHERE team_id = :team_id AND user_name = :user_name

-- name: upsert_member
INSERT INTO team_members (team_id, user_name, tokens_per_day, usd_micros_per_day,
                          usd_micros_per_month, revision, created_at, updated_at)
VALUES (:team_id, :user_name, :tokens_per_day, :usd_micros_per_day, :usd_micros_per_month,
        1, :now, :now)
ON CONFLICT (team_id, user_name) DO UPDATE
   SET tokens_per_day = excluded.tokens_per_day,
       usd_micros_per_day = excluded.usd_micros_per_day,
       usd_micros_per_month = excluded.usd_micros_per_month,
       revision = team_members.revision + 1, updated_at = excluded.updated_at

-- name: delete_member
DELETE FROM team_members WHERE team_id = :team_id AND user_name = :user_name

-- name: bump_team
-- A member or user edit moves the team's revision: admissions planned with the old
-- budget are re-planned.
UPDATE teams SET revision = revision + 1 WHERE id = :id

-- name: bump_user_teams
UPDATE teams SET revision = revision + 1
 WHERE id IN (SELECT team_id FROM keys WHERE user = :name)

-- name: users
SELECT * FROM users ORDER BY name

-- name: user
SELECT * FROM users WHERE name = :name

-- name: upsert_user
INSERT INTO users (name, email, display_name, tokens_per_day, usd_micros_per_day,
                   usd_micros_per_month, revision, created_at, updated_at)
VALUES (:name, :email, :display_name, :tokens_per_day, :usd_micros_per_day,
        :usd_micros_per_month, 1, :now, :now)
ON CONFLICT (name) DO UPDATE
   SET email = excluded.email, display_name = excluded.display_name,
       tokens_per_day = excluded.tokens_per_day,
       usd_micros_per_day = excluded.usd_micros_per_day,
       usd_micros_per_month = excluded.usd_micros_per_month,
       revision = users.revision + 1, updated_at = excluded.updated_at

-- name: insert_console_session
INSERT INTO console_sessions (id_sha256, subject, access, credential_sha256, created_at,
                              last_seen_at, expires_at)
VALUES (:id_sha256, :subject, :access, :credential_sha256, :now, :now, :expires_at)

-- name: purge_console_sessions
DELETE FROM console_sessions WHERE expires_at < :before

-- name: console_session
-- A session that is not ended, not expired and was used since :idle_since; its last use
-- becomes :now.
UPDATE console_sessions SET last_seen_at = :now
 WHERE id_sha256 = :id_sha256 AND ended_at IS NULL AND expires_at > :now
   AND last_seen_at > :idle_since
RETURNING subject, access, credential_sha256, created_at, expires_at

-- name: end_console_session
UPDATE console_sessions SET ended_at = :now WHERE id_sha256 = :id_sha256 AND ended_at IS NULL

-- name: end_console_sessions
UPDATE console_sessions SET ended_at = :now
 WHERE credential_sha256 = :credential_sha256 AND ended_at IS NULL

-- name: brokered_keys
-- The keys a lease-profile plane holds from inferplaned's heartbeat answers
-- (gateway/lease/_client.py): display prefix 'brokered' (a brokered credential's key) or
-- 'inferplaned' (a key made at inferplaned's admin surface), which no key made here has
-- (a created key's prefix is the first characters of its secret, ``sk-inf-…``).
SELECT id, team_id, key_hash, user, revoked_at FROM keys
 WHERE display_prefix IN ('brokered', 'inferplaned')

-- name: insert_brokered_key
-- Only the hash: no secret of a brokered key exists, and a key made at inferplaned keeps
-- its secret with whoever made it.
INSERT INTO keys (id, team_id, key_hash, display_prefix, name, user, revision, created_at)
VALUES (:id, :team_id, :key_hash, :display_prefix, :name, :user, 1, :created_at)
ON CONFLICT DO NOTHING

-- name: rehash_brokered_key
-- A key made at inferplaned whose secret was rotated there: the new hash, now.
UPDATE keys SET key_hash = :key_hash, revision = revision + 1
 WHERE id = :id AND revoked_at IS NULL
