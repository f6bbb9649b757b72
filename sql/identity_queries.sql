-- inferplaned's token exchange and user revocation (controlplane/identity.py):
-- one person per (issuer, subject), one brokered key per user and team.

-- name: user_by_subject
SELECT name, revoked_at FROM users WHERE issuer = %(issuer)s AND subject = %(subject)s

-- name: bind_user
-- A person seen first: a new user named by the configured claim, or an existing user of
-- that name not yet bound to any identity (an admin made it before they signed in).
-- No row back: the name belongs to another identity.
INSERT INTO users (name, email, issuer, subject)
VALUES (%(name)s, %(email)s, %(issuer)s, %(subject)s)
ON CONFLICT (name) DO UPDATE
   SET issuer = EXCLUDED.issuer, subject = EXCLUDED.subject,
       email = COALESCE(users.email, EXCLUDED.email), updated_at = clock_timestamp()
 WHERE users.issuer IS NULL
RETURNING name, revoked_at

-- name: team_by_name
SELECT id, name FROM teams WHERE name = %(team)s

-- name: brokered_key
SELECT key_hash FROM keys
 WHERE team_id = %(team_id)s AND user_name = %(user)s AND brokered AND revoked_at IS NULL

-- name: insert_brokered_key
-- The key a user's credentials in one team stand for; its secret is never kept (only its
-- hash, which the credentials carry), so it authenticates nothing by itself.
INSERT INTO keys (id, team_id, key_hash, display_prefix, name, user_name, brokered)
VALUES (%(id)s, %(team_id)s, %(key_hash)s, 'brokered', 'brokered credential', %(user)s,
        true)
ON CONFLICT DO NOTHING
RETURNING key_hash

-- name: revoke_user
-- Refuses the user's exchanges from now on and every credential already issued: their
-- brokered keys are revoked (a gateway resolves a credential by its key on each request).
WITH revoked_keys AS (
    UPDATE keys SET revoked_at = clock_timestamp(), revision = revision + 1
     WHERE user_name = %(name)s AND brokered AND revoked_at IS NULL
    RETURNING id
)
UPDATE users SET revoked_at = COALESCE(revoked_at, clock_timestamp()),
                 revision = revision + 1, updated_at = clock_timestamp()
 WHERE name = %(name)s
RETURNING name, revoked_at, (SELECT count(*) FROM revoked_keys) AS keys_revoked

-- name: reinstate_user
UPDATE users SET revoked_at = NULL, revision = revision + 1, updated_at = clock_timestamp()
 WHERE name = %(name)s
RETURNING name

-- name: user_revoked
-- Whether a person is revoked, by user name (the console's sessions and the admin API's
-- bearers of people signed in through an issuer; gateway/admin/_people.py).
SELECT revoked_at FROM users WHERE name = %(name)s AND revoked_at IS NOT NULL

-- name: plane_keys
-- What a lease-profile plane of these teams holds from inferplaned (controlplane/identity.py,
-- on every heartbeat): the keys of its teams in this key store that a plane can enforce
-- as they are (brokered keys, and keys with no per-key limit and no expiry, such as
-- those POST /v1alpha1/teams/{team}/keys makes): first the deny list (those revoked since
-- %(revoked_since)s, with their time), then the active ones, in id order; at most
-- %(limit)s rows.
SELECT k.id, t.name AS team, k.user_name, k.key_hash, k.revoked_at, k.brokered, k.name
  FROM keys k JOIN teams t ON t.id = k.team_id
 WHERE t.name = ANY(%(teams)s)
   AND (k.brokered OR (k.allowed_models IS NULL AND k.rpm IS NULL AND k.tpm IS NULL
        AND k.usd_micros_per_day IS NULL AND k.usd_micros_per_month IS NULL
        AND k.expires_at IS NULL))
   AND (k.revoked_at IS NULL OR k.revoked_at > %(revoked_since)s)
 ORDER BY k.revoked_at IS NULL, k.id
 LIMIT %(limit)s
