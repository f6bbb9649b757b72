-- Named queries used by the Postgres stores (gateway/keys/_postgres.py,
-- gateway/governance/_postgres.py, gateway/policy/_pgstore.py).
-- Each query starts with a "-- name: <name>" line; parameters are %(name)s.

-- name: resolve_key
-- Key, team, member and user budgets in one statement = one MVCC snapshot; expiry against database time. The
-- hash is the key's current secret's or, within its grace, one a rotation replaced
-- (secret_valid_until: when that grace ends).
WITH hit AS (
    SELECT id, NULL::timestamptz AS valid_until FROM keys WHERE key_hash = %(key_hash)s
    UNION ALL
    SELECT key_id, old_valid_until FROM key_rotations
     WHERE old_key_hash = %(key_hash)s AND old_valid_until > clock_timestamp()
)
SELECT k.id AS key_id, k.display_prefix, k.revision AS key_revision, k.user_name,
       k.allowed_models, k.rpm AS key_rpm, k.tpm AS key_tpm,
       k.usd_micros_per_day AS key_usd_day, k.usd_micros_per_month AS key_usd_month,
       t.id AS team_id, t.name AS team_name, t.rpm, t.tpm, t.tokens_per_day,
       t.budget_fit_floor,
       t.usd_micros_per_day, t.usd_micros_per_month, t.region, t.guardrails,
       t.revision AS team_revision, t.created_at AS team_created_at,
       hit.valid_until AS secret_valid_until,
       m.user_name AS member_user, m.tokens_per_day AS member_tokens_day,
       m.usd_micros_per_day AS member_usd_day, m.usd_micros_per_month AS member_usd_month,
       u.name AS user_row, u.tokens_per_day AS user_tokens_day,
       u.usd_micros_per_day AS user_usd_day, u.usd_micros_per_month AS user_usd_month
  FROM hit JOIN keys k ON k.id = hit.id JOIN teams t ON t.id = k.team_id
  -- The user's member row in this team, else the team's default ('*' sorts first).
  LEFT JOIN LATERAL (
      SELECT * FROM team_members tm
       WHERE k.user_name IS NOT NULL AND tm.team_id = k.team_id
         AND tm.user_name IN (k.user_name, '*')
       ORDER BY tm.user_name = '*' LIMIT 1) m ON true
  LEFT JOIN users u ON u.name = k.user_name
 WHERE k.revoked_at IS NULL
   AND (k.expires_at IS NULL OR k.expires_at > clock_timestamp())
 LIMIT 1

-- name: insert_team
INSERT INTO teams (id, name, rpm, tpm, tokens_per_day, usd_micros_per_day,
                   usd_micros_per_month, budget_fit_floor, region, guardrails)
VALUES (%(id)s, %(name)s, %(rpm)s, %(tpm)s, %(tokens_per_day)s, %(usd_micros_per_day)s,
        %(usd_micros_per_month)s, %(budget_fit_floor)s, %(region)s, %(guardrails)s)
RETURNING *

-- name: find_team
SELECT * FROM teams WHERE id = %(name_or_id)s OR name = %(name_or_id)s
 ORDER BY id = %(name_or_id)s DESC LIMIT 1

-- name: find_team_for_update
SELECT * FROM teams WHERE id = %(name_or_id)s OR name = %(name_or_id)s
 ORDER BY id = %(name_or_id)s DESC LIMIT 1 FOR UPDATE

-- name: update_team
-- A team's limits and guardrail profiles, as a whole (the caller holds the row FOR UPDATE
-- and passes what it keeps); the revision moves, so every replica re-plans with them.
UPDATE teams SET rpm = %(rpm)s, tpm = %(tpm)s, tokens_per_day = %(tokens_per_day)s,
       usd_micros_per_day = %(usd_micros_per_day)s,
       usd_micros_per_month = %(usd_micros_per_month)s,
       budget_fit_floor = %(budget_fit_floor)s, guardrails = %(guardrails)s,
       revision = revision + 1, updated_at = clock_timestamp()
 WHERE id = %(id)s
RETURNING *

-- name: list_teams
SELECT * FROM teams ORDER BY name

-- name: insert_key
INSERT INTO keys (id, team_id, key_hash, display_prefix, name, user_name, allowed_models,
                  rpm, tpm, usd_micros_per_day, usd_micros_per_month, expires_at)
VALUES (%(id)s, %(team_id)s, %(key_hash)s, %(display_prefix)s, %(name)s, %(user_name)s,
        %(allowed_models)s, %(rpm)s, %(tpm)s, %(usd_micros_per_day)s,
        %(usd_micros_per_month)s, %(expires_at)s)
RETURNING *

-- name: get_key
SELECT * FROM keys WHERE id = %(id)s

-- name: get_key_for_update
SELECT * FROM keys WHERE id = %(id)s FOR UPDATE

-- name: list_keys
SELECT * FROM keys
 WHERE (%(team_id)s::text IS NULL OR team_id = %(team_id)s)
   AND (%(include_revoked)s OR revoked_at IS NULL)
 ORDER BY created_at, id

-- name: update_key
-- An edited key (the caller holds its row FOR UPDATE and computed every field).
UPDATE keys SET name = %(name)s, user_name = %(user_name)s,
       allowed_models = %(allowed_models)s, rpm = %(rpm)s, tpm = %(tpm)s,
       usd_micros_per_day = %(usd_micros_per_day)s,
       usd_micros_per_month = %(usd_micros_per_month)s, expires_at = %(expires_at)s,
       revision = revision + 1
 WHERE id = %(id)s
RETURNING *

-- name: key_rotation_by_idempotency
SELECT * FROM key_rotations
 WHERE key_id = %(key_id)s AND idempotency_hash = %(idempotency_hash)s

-- name: rotate_key
-- The key's new secret (the caller holds its row FOR UPDATE and records the rotation).
UPDATE keys SET key_hash = %(key_hash)s, display_prefix = %(display_prefix)s,
       revision = revision + 1
 WHERE id = %(id)s
RETURNING *

-- name: end_replaced_secrets
-- A new rotation ends the grace every earlier rotation left running (the caller holds
-- the key FOR UPDATE), so a key has at most two working secrets: its current one and
-- the one this rotation replaces, for its own grace.
UPDATE key_rotations SET old_valid_until = clock_timestamp()
 WHERE key_id = %(key_id)s AND old_valid_until > clock_timestamp()

-- name: insert_key_rotation
INSERT INTO key_rotations (key_id, revision, old_key_hash, old_valid_until, new_key_hash,
                           idempotency_hash, salt)
VALUES (%(key_id)s, %(revision)s, %(old_key_hash)s,
        clock_timestamp() + make_interval(secs => %(grace_s)s), %(new_key_hash)s,
        %(idempotency_hash)s, %(salt)s)
RETURNING old_valid_until

-- name: revoke_key
UPDATE keys SET revoked_at = clock_timestamp(), revision = revision + 1
 WHERE id = %(id)s AND revoked_at IS NULL
RETURNING *

-- name: admit_one
-- One admission (a JSON array of one gateway.governance.AdmissionRequest); one answer.
SELECT inferplane_admit_one_v2(%(requests)s::jsonb) AS results

-- name: admit_batch
-- A coalesced batch of admissions; one answer per request, in order.
SELECT inferplane_admit_v2(%(requests)s::jsonb) AS results

-- name: settle_one
-- One settlement, with its request log facts (permit_facts).
SELECT inferplane_settle_one_v2(%(permit_id)s::uuid, %(settlement)s::jsonb,
                                %(facts)s::jsonb) AS result

-- name: settle_batch
-- A coalesced batch of settlements in one transaction: a JSON array of settle_one's
-- settlement, each with its "permit_id", and their request log facts; one answer per
-- element.
SELECT inferplane_settle_v2(%(items)s::jsonb, %(facts)s::jsonb) AS results

-- name: settle_admit
-- Settlements then admissions waiting at once, in one transaction (merge_batches).
SELECT inferplane_settle_admit_v2(%(items)s::jsonb, %(facts)s::jsonb,
                                  %(requests)s::jsonb) AS results

-- name: resolve
SELECT inferplane_resolve_v2(%(permit_id)s::uuid, %(settlement)s::jsonb,
                             %(facts)s::jsonb) AS result

-- name: current_generation
SELECT generation FROM policy_state

-- name: usage
-- Per scope and window, from the permits' captured day/month: pending and invalid
-- permits count their bounds as reserved (they still bind), settled ones what they
-- committed and, apart, their liability; a request cancelled before dispatch is not
-- counted.
WITH p AS (
    SELECT key_id, team_id, user_name, day, month, status, token_bound, usd_bound,
           tokens_committed, usd_committed, tokens_liability, usd_liability,
           status NOT IN ('pending', 'invalid') AS settled
      FROM permits
     WHERE day = %(day)s OR month = %(month)s
), scoped AS (
    SELECT 'key' AS scope, key_id AS sid, * FROM p
    UNION ALL SELECT 'team', team_id, * FROM p
    UNION ALL SELECT 'user', user_name, * FROM p WHERE user_name IS NOT NULL
), windowed AS (
    SELECT 'day' AS win, %(day)s AS period, * FROM scoped WHERE day = %(day)s
    UNION ALL
    SELECT 'month', %(month)s, * FROM scoped WHERE month = %(month)s
)
SELECT scope, sid AS id, win AS window, period,
       coalesce(sum(CASE WHEN settled THEN tokens_committed ELSE 0 END), 0)::bigint
           AS tokens_committed,
       coalesce(sum(CASE WHEN settled THEN 0 ELSE token_bound END), 0)::bigint
           AS tokens_reserved,
       coalesce(sum(CASE WHEN settled THEN usd_committed ELSE 0 END), 0)::bigint
           AS usd_committed,
       coalesce(sum(CASE WHEN settled THEN 0 ELSE usd_bound END), 0)::bigint
           AS usd_reserved,
       coalesce(sum(CASE WHEN settled THEN coalesce(tokens_liability, 0) ELSE 0 END),
                0)::bigint AS tokens_liability,
       coalesce(sum(CASE WHEN settled THEN coalesce(usd_liability, 0) ELSE 0 END),
                0)::bigint AS usd_liability,
       count(*) FILTER (WHERE status <> 'cancelled')::bigint AS requests
  FROM windowed
 WHERE CASE
         WHEN scope = 'team' AND %(team_id)s::text IS NOT NULL THEN team_id = %(team_id)s
         WHEN scope = 'team' AND %(key_id)s::text IS NOT NULL THEN team_id IN
              (SELECT k.team_id FROM keys k WHERE k.id = %(key_id)s)
         WHEN %(key_id)s::text IS NOT NULL THEN key_id = %(key_id)s
         WHEN %(team_id)s::text IS NOT NULL THEN team_id = %(team_id)s
         ELSE true
       END
 GROUP BY scope, sid, win, period
 ORDER BY CASE scope WHEN 'key' THEN 0 WHEN 'team' THEN 1 ELSE 2 END,
          CASE win WHEN 'day' THEN 0 ELSE 1 END, sid

-- name: counter
SELECT key, kind, dimension, "limit", balance, updated_us, "window", reserved, committed,
       frozen, 0::bigint AS leased_outstanding, liability
  FROM counters WHERE key = %(key)s
UNION ALL
SELECT key, 'account', 'usd', "limit", NULL, NULL, window_period, reserved, committed,
       frozen, leased_outstanding, liability
  FROM authority_accounts WHERE key = %(key)s

-- name: figures
-- GET /v1/me: the counters and accounts named in %(keys)s as stored, with the database
-- clock admission refills buckets by (inferplane_now_us_v1).
SELECT key, balance, updated_us, reserved, committed, liability,
       0::bigint AS leased, frozen, inferplane_now_us_v1() AS now_us
  FROM counters WHERE key = ANY(%(keys)s)
UNION ALL
SELECT key, NULL, NULL, reserved, committed, liability, leased_outstanding, frozen,
       inferplane_now_us_v1()
  FROM authority_accounts WHERE key = ANY(%(keys)s)

-- name: pending_permits
SELECT id::text AS id FROM permits WHERE status = 'pending' ORDER BY created_at, id

-- name: policy_state_for_update
SELECT s.generation, s.fingerprint, n.namespace::text AS namespace,
       coalesce(g.documents, '{}'::jsonb) AS documents
  FROM policy_state s CROSS JOIN authority_namespace n
  LEFT JOIN policy_generations g ON g.generation = s.generation
   FOR UPDATE OF s

-- name: policy_current
SELECT s.generation, s.fingerprint, n.namespace::text AS namespace,
       coalesce(g.documents, '{}'::jsonb) AS documents, g.author, g.created_at
  FROM policy_state s CROSS JOIN authority_namespace n
  LEFT JOIN policy_generations g ON g.generation = s.generation

-- name: policy_insert_generation
INSERT INTO policy_generations (generation, fingerprint, documents, author)
VALUES (%(generation)s, %(fingerprint)s, %(documents)s, %(author)s)

-- name: policy_insert_change
INSERT INTO policy_changes (generation, name, action, author, before, after)
VALUES (%(generation)s, %(name)s, %(action)s, %(author)s, %(before)s, %(after)s)

-- name: policy_set_state
UPDATE policy_state SET generation = %(generation)s, fingerprint = %(fingerprint)s

-- name: policy_changes_since
SELECT id, generation, name, action, author, at, before, after
  FROM policy_changes WHERE generation > %(since)s ORDER BY id

-- name: policy_notify
SELECT pg_notify('inferplane_policy', %(payload)s)

-- name: import_team
-- Copy one team verbatim (id, revision, timestamps); a clash on any unique column
-- inserts nothing and the importer compares.
INSERT INTO teams (id, name, rpm, tpm, tokens_per_day, usd_micros_per_day,
                   usd_micros_per_month, budget_fit_floor, region, guardrails, revision,
                   created_at)
VALUES (%(id)s, %(name)s, %(rpm)s, %(tpm)s, %(tokens_per_day)s, %(usd_micros_per_day)s,
        %(usd_micros_per_month)s, %(budget_fit_floor)s, %(region)s, %(guardrails)s,
        %(revision)s, %(created_at)s)
ON CONFLICT DO NOTHING
RETURNING *

-- name: import_key
-- Copy one key verbatim: hash, prefix, revision, timestamps and tombstone; never plaintext.
INSERT INTO keys (id, team_id, key_hash, display_prefix, name, user_name, allowed_models,
                  rpm, tpm, usd_micros_per_day, usd_micros_per_month, expires_at,
                  revoked_at, revision, created_at)
VALUES (%(id)s, %(team_id)s, %(key_hash)s, %(display_prefix)s, %(name)s, %(user_name)s,
        %(allowed_models)s, %(rpm)s, %(tpm)s, %(usd_micros_per_day)s,
        %(usd_micros_per_month)s, %(expires_at)s, %(revoked_at)s, %(revision)s,
        %(created_at)s)
ON CONFLICT DO NOTHING
RETURNING *

-- name: team_by_id
SELECT * FROM teams WHERE id = %(id)s

-- name: declare
-- Register a replica's bootstrap declaration; returns a row only for the first one.
INSERT INTO bootstrap_declarations (kind, name, fingerprint)
VALUES (%(kind)s, %(name)s, %(fingerprint)s)
ON CONFLICT DO NOTHING
RETURNING fingerprint

-- name: declaration_for_update
SELECT fingerprint FROM bootstrap_declarations
 WHERE kind = %(kind)s AND name = %(name)s FOR UPDATE

-- name: unfreeze
-- Operator action after investigating invalid usage: lift a freeze (counter or account).
WITH c AS (UPDATE counters SET frozen = false WHERE key = %(key)s AND frozen RETURNING 1),
     a AS (UPDATE authority_accounts SET frozen = false WHERE key = %(key)s AND frozen
           RETURNING 1)
SELECT (SELECT count(*) FROM c) + (SELECT count(*) FROM a) AS lifted

-- name: get_permit
-- Operator tools (gateway/cli/_permits.py): a permit and, below, its segments, from which
-- PostgresGovernanceStore.get_permit rebuilds the AdmissionRequest it was granted for.
SELECT id::text AS id, request_id, key_id, team_id, user_name, model, token_bound,
       usd_bound, generation, day, month
  FROM permits WHERE id = %(permit_id)s::uuid

-- name: get_permit_segments
SELECT counter, kind, dimension, amount, "limit", "window", rule_uid, hard
  FROM permit_segments WHERE permit_id = %(permit_id)s::uuid ORDER BY counter COLLATE "C"

-- name: list_permits
-- Oldest first; ages and the cut-off use database time, like admission does.
SELECT id::text AS id, request_id, key_id, team_id, user_name AS "user", model,
       token_bound, usd_bound, status, created_at,
       floor(extract(epoch FROM clock_timestamp() - created_at))::bigint AS age_s,
       tokens_committed, usd_committed, tokens_liability, usd_liability, bound_exceeded,
       detail, f.route, f.deployment, f.client, f.http_status, f.input AS input_tokens,
       f.output AS output_tokens, f.cache_read AS cache_read_tokens,
       f.cache_write_5m AS cache_write_5m_tokens, f.cache_write_1h AS cache_write_1h_tokens,
       f.cache_write_unknown AS cache_write_unknown_tokens, t.tier, permits.plane
  FROM permits LEFT JOIN permit_facts f ON f.permit_id = permits.id
       LEFT JOIN permit_tiers t ON t.permit_id = permits.id
 WHERE (NOT %(pending_only)s OR status = 'pending')
   AND (%(older_than_s)s::bigint IS NULL
        OR created_at <= clock_timestamp() - %(older_than_s)s::bigint * interval '1 second')
   AND (%(permit_id)s::uuid IS NULL OR id = %(permit_id)s::uuid)
 ORDER BY created_at, id
 LIMIT %(limit)s

-- name: insert_permit_tier
-- The tier that served a permit's attempt (routing.soft_tier), once per permit.
INSERT INTO permit_tiers (permit_id, tier) VALUES (%(permit_id)s::uuid, %(tier)s)
ON CONFLICT (permit_id) DO NOTHING

-- name: request_log
-- The request log (GET /admin/v1/requests): permits newest first, as list_permits, each
-- filter applied unless NULL; (before_at, before_id) is the page position, ordered by
-- the uuid as permits_created_idx is; plane: one lease plane's shipped records (NULL:
-- every plane's and the shared profile's own). The time bounds and the position's time are
-- ranges (an absent one open), not "IS NULL OR": the plan Postgres caches for a prepared
-- statement, whatever its parameters, then still reads permits_created_idx backwards
-- from there instead of sorting every permit for a page (tests/bench/requestlog.py).
SELECT id::text AS id, request_id, key_id, team_id, user_name AS "user", model,
       token_bound, usd_bound, status, created_at,
       floor(extract(epoch FROM clock_timestamp() - created_at))::bigint AS age_s,
       tokens_committed, usd_committed, tokens_liability, usd_liability, bound_exceeded,
       detail, f.route, f.deployment, f.client, f.http_status, f.input AS input_tokens,
       f.output AS output_tokens, f.cache_read AS cache_read_tokens,
       f.cache_write_5m AS cache_write_5m_tokens, f.cache_write_1h AS cache_write_1h_tokens,
       f.cache_write_unknown AS cache_write_unknown_tokens, t.tier, permits.plane
  FROM permits LEFT JOIN permit_facts f ON f.permit_id = permits.id
       LEFT JOIN permit_tiers t ON t.permit_id = permits.id
 WHERE (%(team_id)s::text IS NULL OR team_id = %(team_id)s)
   AND (%(key_id)s::text IS NULL OR key_id = %(key_id)s)
   AND (%(user)s::text IS NULL OR user_name = %(user)s)
   AND (%(model)s::text IS NULL OR model = %(model)s)
   AND (%(status)s::text IS NULL OR status = %(status)s)
   AND (%(client)s::text IS NULL OR f.client = %(client)s)
   AND (%(plane)s::text IS NULL OR permits.plane = %(plane)s)
   AND created_at >= coalesce(%(since)s::timestamptz, '-infinity')
   AND created_at < coalesce(%(until)s::timestamptz, 'infinity')
   AND created_at <= coalesce(%(before_at)s::timestamptz, 'infinity')
   AND (%(before_at)s::timestamptz IS NULL
        OR (created_at, permits.id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
 ORDER BY created_at DESC, permits.id DESC
 LIMIT %(limit)s

-- name: request_summary
-- The request log summed (GET /admin/v1/requests/summary): one row per asked group
-- (a group not asked is NULL) and UTC period (NULL for bucket 'none'), counted as
-- /v1/usage counts: a settled permit its committed and, apart, its liability; a
-- pending or invalid one its bounds as reserved; a cancelled one is no request. The
-- filters are request_log's (plane: one lease plane's shipped records).
SELECT CASE WHEN %(by_team)s THEN team_id END AS team_id,
       CASE WHEN %(by_user)s THEN user_name END AS "user",
       CASE WHEN %(by_key)s THEN key_id END AS key_id,
       CASE WHEN %(by_model)s THEN model END AS model,
       CASE WHEN %(by_tool)s THEN f.client END AS tool,
       CASE %(bucket)s::text
            WHEN 'day' THEN to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')
            WHEN 'hour' THEN to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24')
       END AS period,
       count(*) FILTER (WHERE status <> 'cancelled')::bigint AS requests,
       coalesce(sum(tokens_committed) FILTER (WHERE status NOT IN ('pending', 'invalid')),
                0)::bigint AS tokens_committed,
       coalesce(sum(usd_committed) FILTER (WHERE status NOT IN ('pending', 'invalid')),
                0)::bigint AS usd_committed,
       coalesce(sum(tokens_liability) FILTER (WHERE status NOT IN ('pending', 'invalid')),
                0)::bigint AS tokens_liability,
       coalesce(sum(usd_liability) FILTER (WHERE status NOT IN ('pending', 'invalid')),
                0)::bigint AS usd_liability,
       coalesce(sum(token_bound) FILTER (WHERE status IN ('pending', 'invalid')),
                0)::bigint AS tokens_reserved,
       coalesce(sum(usd_bound) FILTER (WHERE status IN ('pending', 'invalid')),
                0)::bigint AS usd_reserved
  FROM permits LEFT JOIN permit_facts f ON f.permit_id = permits.id
 WHERE (%(team_id)s::text IS NULL OR team_id = %(team_id)s)
   AND (%(key_id)s::text IS NULL OR key_id = %(key_id)s)
   AND (%(user)s::text IS NULL OR user_name = %(user)s)
   AND (%(model)s::text IS NULL OR model = %(model)s)
   AND (%(status)s::text IS NULL OR status = %(status)s)
   AND (%(client)s::text IS NULL OR f.client = %(client)s)
   AND (%(plane)s::text IS NULL OR permits.plane = %(plane)s)
   AND created_at >= coalesce(%(since)s::timestamptz, '-infinity')
   AND created_at < coalesce(%(until)s::timestamptz, 'infinity')
 GROUP BY 1, 2, 3, 4, 5, 6

-- name: frozen_counters
-- Frozen money windows and policy accounts, each with the latest invalid permit that
-- charged it (found from the invalid permits, then their segments by primary key).
SELECT c.key AS counter, c.kind, c."limit", c.reserved, c.committed, c.liability,
       (SELECT p.id::text FROM permits p
          JOIN permit_segments ps ON ps.permit_id = p.id AND ps.counter = c.key
         WHERE p.status = 'invalid' ORDER BY p.settled_at DESC LIMIT 1) AS frozen_by
  FROM counters c WHERE c.frozen
UNION ALL
SELECT a.key, 'account', a."limit", a.reserved, a.committed, a.liability,
       (SELECT p.id::text FROM permits p
          JOIN permit_segments ps ON ps.permit_id = p.id AND ps.counter = a.key
         WHERE p.status = 'invalid' ORDER BY p.settled_at DESC LIMIT 1)
  FROM authority_accounts a WHERE a.frozen
 ORDER BY counter

-- name: import_permits
-- mayu keys import (gateway/keys/_import_spend.py): copy settled local permits with
-- their ids, figures and times (µs since the epoch, exact); a permit whose id is there
-- already is left alone. Returns the ids inserted (32 hex digits, as the local store
-- writes them): only their spend is then added to the counters, so each local permit's
-- spend arrives exactly once however often the import runs.
INSERT INTO permits (id, request_id, key_id, team_id, user_name, model, token_bound,
                     usd_bound, generation, day, month, status, settle_fingerprint,
                     detail, tokens_committed, usd_committed, tokens_liability,
                     usd_liability, bound_exceeded, admitted_us, created_at, settled_at,
                     resolved_at)
SELECT x.id, x.request_id, x.key_id, x.team_id, x.user_name, x.model, x.token_bound,
       x.usd_bound, x.generation, x.day, x.month, x.status, x.settle_fingerprint,
       x.detail, x.tokens_committed, x.usd_committed, x.tokens_liability,
       x.usd_liability, x.bound_exceeded, x.admitted_us,
       timestamptz 'epoch' + x.admitted_us * interval '1 microsecond',
       timestamptz 'epoch' + x.settled_us * interval '1 microsecond',
       timestamptz 'epoch' + x.resolved_us * interval '1 microsecond'
  FROM jsonb_to_recordset(%(permits)s::jsonb)
       AS x(id uuid, request_id text, key_id text, team_id text, user_name text,
            model text, token_bound bigint, usd_bound bigint, generation bigint,
            day text, month text, status text, settle_fingerprint text, detail text,
            tokens_committed bigint, usd_committed bigint, tokens_liability bigint,
            usd_liability bigint, bound_exceeded boolean, admitted_us bigint,
            settled_us bigint, resolved_us bigint)
 ORDER BY x.id
ON CONFLICT (id) DO NOTHING
RETURNING replace(id::text, '-', '') AS id

-- name: import_permits_present
-- mayu keys import: the permits of a batch that were there already, to compare with
-- the local ones (a difference is a conflict).
SELECT replace(id::text, '-', '') AS id, request_id, key_id, team_id, model, day, month,
       status, tokens_committed, usd_committed, tokens_liability, usd_liability
  FROM permits WHERE id = ANY(%(ids)s::uuid[])

-- name: import_segments
-- mayu keys import: the segments (every charge, with what settlement wrote on it) of
-- the permits import_permits inserted.
INSERT INTO permit_segments (permit_id, counter, kind, dimension, amount, "limit",
                             "window", rule_uid, hard, committed, liability)
SELECT x.permit_id, x.counter, x.kind, x.dimension, x.amount, x."limit", x."window",
       x.rule_uid, x.hard, x.committed, x.liability
  FROM jsonb_to_recordset(%(segments)s::jsonb)
       AS x(permit_id uuid, counter text, kind text, dimension text, amount bigint,
            "limit" bigint, "window" text, rule_uid text, hard boolean, committed bigint,
            liability bigint)

-- name: import_spend_accounts
-- mayu keys import: add the imported permits' spend to the policy accounts (created as
-- admission would create them if missing): committed, liability and reserved (an invalid
-- permit's bound) grow by the amounts given, never set, so the shared profile's own
-- spend stays; a freeze is only ever added. Locked in byte order (the global order:
-- accounts, then counters).
INSERT INTO authority_accounts AS a (key, rule_uid, scope, window_period, "limit", hard,
                                     committed, liability, reserved, frozen)
SELECT x.key, x.rule_uid, x.scope, x."window", x."limit", x.hard, x.committed,
       x.liability, x.reserved, x.frozen
  FROM jsonb_to_recordset(%(rows)s::jsonb)
       AS x(key text, rule_uid text, scope text, "window" text, "limit" bigint,
            hard boolean, committed bigint, liability bigint, reserved bigint,
            frozen boolean)
 ORDER BY x.key COLLATE "C"
ON CONFLICT (key) DO UPDATE
   SET committed = a.committed + excluded.committed,
       liability = a.liability + excluded.liability,
       reserved = a.reserved + excluded.reserved, frozen = a.frozen OR excluded.frozen
RETURNING key

-- name: import_spend_counters
-- mayu keys import: the same for the key, team and rule calendar windows (µUSD and
-- tokens), after the accounts.
INSERT INTO counters AS c (key, kind, dimension, "limit", "window", committed, liability,
                           reserved, frozen)
SELECT x.key, 'window', x.dimension, x."limit", x."window", x.committed, x.liability,
       x.reserved, x.frozen
  FROM jsonb_to_recordset(%(rows)s::jsonb)
       AS x(key text, dimension text, "window" text, "limit" bigint, committed bigint,
            liability bigint, reserved bigint, frozen boolean)
 ORDER BY x.key COLLATE "C"
ON CONFLICT (key) DO UPDATE
   SET committed = c.committed + excluded.committed,
       liability = c.liability + excluded.liability,
       reserved = c.reserved + excluded.reserved, frozen = c.frozen OR excluded.frozen
RETURNING key

-- name: list_members
SELECT * FROM team_members WHERE team_id = %(team_id)s ORDER BY user_name

-- name: find_member
SELECT * FROM team_members WHERE team_id = %(team_id)s AND user_name = %(user_name)s

-- name: find_member_for_update
SELECT * FROM team_members WHERE team_id = %(team_id)s AND user_name = %(user_name)s
   FOR UPDATE

-- name: upsert_member
-- Create or replace a member's budget; its team's revision moves in the same statement
-- (the caller holds the team row FOR UPDATE).
WITH bumped AS (
    UPDATE teams SET revision = revision + 1, updated_at = clock_timestamp()
     WHERE id = %(team_id)s
)
INSERT INTO team_members (team_id, user_name, tokens_per_day, usd_micros_per_day,
                          usd_micros_per_month)
VALUES (%(team_id)s, %(user_name)s, %(tokens_per_day)s, %(usd_micros_per_day)s,
        %(usd_micros_per_month)s)
ON CONFLICT (team_id, user_name) DO UPDATE
   SET tokens_per_day = EXCLUDED.tokens_per_day,
       usd_micros_per_day = EXCLUDED.usd_micros_per_day,
       usd_micros_per_month = EXCLUDED.usd_micros_per_month,
       revision = team_members.revision + 1, updated_at = clock_timestamp()
RETURNING *

-- name: delete_member
WITH bumped AS (
    UPDATE teams SET revision = revision + 1, updated_at = clock_timestamp()
     WHERE id = %(team_id)s
)
DELETE FROM team_members WHERE team_id = %(team_id)s AND user_name = %(user_name)s
RETURNING *

-- name: list_users
SELECT * FROM users ORDER BY name

-- name: find_user
SELECT * FROM users WHERE name = %(name)s

-- name: find_user_for_update
SELECT * FROM users WHERE name = %(name)s FOR UPDATE

-- name: lock_user_teams
-- The teams a user holds a key in, locked in id order (a user edit moves their
-- revisions, serialised against admissions, which hold them FOR SHARE).
SELECT t.id FROM teams t
 WHERE t.id IN (SELECT team_id FROM keys WHERE user_name = %(name)s)
 ORDER BY t.id FOR UPDATE

-- name: upsert_user
WITH bumped AS (
    UPDATE teams SET revision = revision + 1, updated_at = clock_timestamp()
     WHERE id IN (SELECT team_id FROM keys WHERE user_name = %(name)s)
)
INSERT INTO users (name, email, display_name, tokens_per_day, usd_micros_per_day,
                   usd_micros_per_month)
VALUES (%(name)s, %(email)s, %(display_name)s, %(tokens_per_day)s,
        %(usd_micros_per_day)s, %(usd_micros_per_month)s)
ON CONFLICT (name) DO UPDATE
   SET email = EXCLUDED.email, display_name = EXCLUDED.display_name,
       tokens_per_day = EXCLUDED.tokens_per_day,
       usd_micros_per_day = EXCLUDED.usd_micros_per_day,
       usd_micros_per_month = EXCLUDED.usd_micros_per_month,
       revision = users.revision + 1, updated_at = clock_timestamp()
RETURNING *

-- name: import_user
-- mayu keys import: one user verbatim (revision, timestamps); a taken name inserts
-- nothing and the importer compares.
INSERT INTO users (name, email, display_name, tokens_per_day, usd_micros_per_day,
                   usd_micros_per_month, revision, created_at, updated_at)
VALUES (%(name)s, %(email)s, %(display_name)s, %(tokens_per_day)s, %(usd_micros_per_day)s,
        %(usd_micros_per_month)s, %(revision)s, %(created_at)s, %(updated_at)s)
ON CONFLICT DO NOTHING
RETURNING *

-- name: import_member
INSERT INTO team_members (team_id, user_name, tokens_per_day, usd_micros_per_day,
                          usd_micros_per_month, revision, created_at, updated_at)
VALUES (%(team_id)s, %(user_name)s, %(tokens_per_day)s, %(usd_micros_per_day)s,
        %(usd_micros_per_month)s, %(revision)s, %(created_at)s, %(updated_at)s)
ON CONFLICT DO NOTHING
RETURNING *

-- name: prune_permits
-- Request-log retention (gateway/governance/_retention.py): settled permits admitted
-- before %(before)s whose month window has ended (month < %(month)s), with their
-- segments and facts, oldest first, at most %(limit)s per call. Pending permits are
-- never pruned, nor any of an open month (the counters hold their windows' figures; the
-- permits only explain them). One replica at a time (a transaction advisory lock: a
-- replica that does not get it prunes nothing this time).
WITH lock AS (
    SELECT pg_try_advisory_xact_lock(4651238117002) AS got
), doomed AS (
    SELECT id FROM permits
     WHERE (SELECT got FROM lock) AND status <> 'pending'
       AND month < %(month)s AND created_at < %(before)s
     ORDER BY created_at LIMIT %(limit)s
), segments AS (
    DELETE FROM permit_segments WHERE permit_id IN (SELECT id FROM doomed)
), facts AS (
    DELETE FROM permit_facts WHERE permit_id IN (SELECT id FROM doomed)
), tiers AS (
    DELETE FROM permit_tiers WHERE permit_id IN (SELECT id FROM doomed)
), gone AS (
    DELETE FROM permits WHERE id IN (SELECT id FROM doomed) RETURNING 1
)
SELECT count(*)::bigint AS pruned FROM gone

-- name: keys_last_used
-- Each key's newest permit (the admin API's last_used_at): one index probe per key
-- (permits_key_created_idx).
SELECT k AS key_id,
       (SELECT max(created_at) FROM permits WHERE key_id = k) AS last_used_at
  FROM unnest(%(keys)s::text[]) AS k

-- name: insert_console_session
-- A console sign-in (gateway/keys/_sessions.py): the session by the SHA-256 of its id,
-- its credential by its SHA-256 only; database time, so every replica agrees on expiry.
INSERT INTO console_sessions (id_sha256, subject, access, credential_sha256, expires_at)
VALUES (%(id_sha256)s, %(subject)s, %(access)s, %(credential_sha256)s,
        now() + make_interval(secs => %(max_age_s)s))

-- name: purge_console_sessions
DELETE FROM console_sessions WHERE expires_at < now() - make_interval(secs => %(after_s)s)

-- name: console_session
-- A session that is not ended, not expired and was used within the last :idle_s
-- seconds; its last use becomes now (one statement: a sign-out on another replica
-- commits before or after it, never half).
UPDATE console_sessions SET last_seen_at = now()
 WHERE id_sha256 = %(id_sha256)s AND ended_at IS NULL AND expires_at > now()
   AND last_seen_at > now() - make_interval(secs => %(idle_s)s)
RETURNING subject, access, credential_sha256, created_at, expires_at

-- name: end_console_session
UPDATE console_sessions SET ended_at = now()
 WHERE id_sha256 = %(id_sha256)s AND ended_at IS NULL

-- name: end_console_sessions
-- Every live session of one credential (a revoked key, a token gone from the config).
UPDATE console_sessions SET ended_at = now()
 WHERE credential_sha256 = %(credential_sha256)s AND ended_at IS NULL

-- name: unsettled_of_requests
-- Pending permits granted to these request ids in the last %(within_s)s seconds: the
-- admissions whose answer a lost connection swallowed after they committed
-- (PostgresGovernanceStore's sweep refunds them). Database time, as admission's.
SELECT id::text AS id FROM permits
 WHERE status = 'pending' AND request_id = ANY(%(request_ids)s)
   AND created_at >= clock_timestamp() - make_interval(secs => %(within_s)s)
