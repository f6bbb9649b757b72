-- The local profile's governance store in SQLite (gateway/governance/_local.py and the
-- modules it uses: _localbatch, _counters, _snapshot, _usage, _ops): counters, permits
-- with their charges, and settlements, in one file (<data_dir>/mayu.db, normally shared
-- with the key store: admission then re-checks the key and team rows, "snapshot_*").
-- Each statement starts with a "-- name: <name>" line; parameters are :name (sqlite3).
-- "schema" is run with executescript when the store opens (gateway/localdb.py).
-- The schema is the present one only: a file created by a pre-release build whose
-- tables lack one of these columns is refused when the store opens, naming the table
-- and the columns (gateway/localdb.py); nothing is altered in place.

-- name: schema
CREATE TABLE IF NOT EXISTS gov_counters (
    counter TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    dimension TEXT NOT NULL,
    balance INTEGER NOT NULL DEFAULT 0,      -- buckets: scaled units (BUCKET_SCALE)
    updated_us INTEGER NOT NULL DEFAULT 0,   -- buckets: last refill, µs since the epoch
    reserved INTEGER NOT NULL DEFAULT 0,     -- windows/accounts
    committed INTEGER NOT NULL DEFAULT 0,    -- windows/accounts
    frozen_by TEXT,                          -- permit whose invalid usage froze it
    liability INTEGER NOT NULL DEFAULT 0     -- windows/accounts (DESIGN §5)
);
CREATE TABLE IF NOT EXISTS gov_permits (
    id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL,
    key_id TEXT NOT NULL, team_id TEXT NOT NULL, user TEXT,
    model TEXT NOT NULL,
    day TEXT NOT NULL, month TEXT NOT NULL,
    token_bound INTEGER NOT NULL, usd_bound INTEGER NOT NULL,
    request BLOB NOT NULL,                   -- the AdmissionRequest, msgspec JSON
    status TEXT NOT NULL,                    -- pending | settled | invalid
    created_us INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS gov_permits_day ON gov_permits(day);
CREATE INDEX IF NOT EXISTS gov_permits_month ON gov_permits(month);
CREATE INDEX IF NOT EXISTS gov_permits_key_created ON gov_permits(key_id, created_us);
-- The request log newest first without a key named, and a time range's summary (as
-- permits_created_idx in Postgres: sql/schema.sql).
CREATE INDEX IF NOT EXISTS gov_permits_created ON gov_permits(created_us, id);
CREATE TABLE IF NOT EXISTS gov_charges (
    permit_id TEXT NOT NULL REFERENCES gov_permits(id),
    seq INTEGER NOT NULL,
    counter TEXT NOT NULL, kind TEXT NOT NULL, dimension TEXT NOT NULL,
    amount INTEGER NOT NULL, "limit" INTEGER, window TEXT, rule_uid TEXT,
    hard INTEGER NOT NULL,
    committed INTEGER,                       -- set by settlement (NULL: pending/invalid)
    liability INTEGER,                       -- set by settlement
    PRIMARY KEY (permit_id, seq)
);
CREATE TABLE IF NOT EXISTS gov_settlements (
    permit_id TEXT PRIMARY KEY REFERENCES gov_permits(id),
    kind TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    tokens_committed INTEGER NOT NULL,
    usd_committed INTEGER NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    settled_us INTEGER NOT NULL,
    tokens_liability INTEGER NOT NULL DEFAULT 0,
    usd_liability INTEGER NOT NULL DEFAULT 0,
    bound_exceeded INTEGER NOT NULL DEFAULT 0,
    resolved_us INTEGER                      -- a later exact figure replaced the liability
);
-- The request log's facts beyond a permit (Postgres: permit_facts, sql/schema.sql): route,
-- deployment, client tool, HTTP status and the tokens per class the upstream reported.
CREATE TABLE IF NOT EXISTS gov_permit_facts (
    permit_id TEXT PRIMARY KEY,
    route TEXT, deployment TEXT, client TEXT, http_status INTEGER,
    input INTEGER, output INTEGER, cache_read INTEGER, cache_write_5m INTEGER,
    cache_write_1h INTEGER, cache_write_unknown INTEGER
);
-- The tier that served a permit's attempt when it was not the model's usual one
-- (routing.soft_tier: 'soft'; Postgres: permit_tiers, sql/schema.sql).
CREATE TABLE IF NOT EXISTS gov_permit_tiers (
    permit_id TEXT PRIMARY KEY,
    tier TEXT NOT NULL
);

-- name: counter
-- One counter, its columns in CounterState's field order (gateway/governance/_counters.py).
SELECT counter, kind, dimension, balance, updated_us, reserved, committed, frozen_by,
       liability
  FROM gov_counters WHERE counter = :counter

-- name: store_counter
INSERT INTO gov_counters (counter, kind, dimension, balance, updated_us, reserved,
                          committed, frozen_by, liability)
VALUES (:counter, :kind, :dimension, :balance, :updated_us, :reserved, :committed,
        :frozen_by, :liability)
ON CONFLICT (counter) DO UPDATE
   SET balance = excluded.balance, updated_us = excluded.updated_us,
       reserved = excluded.reserved, committed = excluded.committed,
       frozen_by = excluded.frozen_by, liability = excluded.liability

-- name: freeze_counter
-- Invalid usage: freeze an existing counter for the permit, unless it is frozen already.
UPDATE gov_counters SET frozen_by = :permit_id
 WHERE counter = :counter AND frozen_by IS NULL

-- name: unfreeze_counter
UPDATE gov_counters SET frozen_by = NULL WHERE counter = :counter AND frozen_by IS NOT NULL

-- name: frozen_counters
-- Every frozen counter; the captured limit lives on the charge that froze it.
SELECT c.counter, c.kind, c.reserved, c.committed, c.frozen_by, c.liability, g."limit"
  FROM gov_counters c LEFT JOIN gov_charges g
    ON g.permit_id = c.frozen_by AND g.counter = c.counter
 WHERE c.frozen_by IS NOT NULL
 ORDER BY c.counter

-- name: has_key_tables
-- Whether the file holds the key store's tables (gateway/governance/_snapshot.py).
SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('keys', 'teams')

-- name: snapshot_key
SELECT team_id, revision, revoked_at, expires_at FROM keys WHERE id = :key_id

-- name: snapshot_team
SELECT revision FROM teams WHERE id = :team_id

-- name: insert_permit
INSERT INTO gov_permits (id, request_id, key_id, team_id, user, model, day, month,
                         token_bound, usd_bound, request, status, created_us)
VALUES (:id, :request_id, :key_id, :team_id, :user, :model, :day, :month, :token_bound,
        :usd_bound, :request, 'pending', :created_us)

-- name: insert_charge
INSERT INTO gov_charges (permit_id, seq, counter, kind, dimension, amount, "limit", window,
                         rule_uid, hard)
VALUES (:permit_id, :seq, :counter, :kind, :dimension, :amount, :limit, :window,
        :rule_uid, :hard)

-- name: claim_permit
-- A pending permit marked settled (or invalid); no row changed: not pending any more.
UPDATE gov_permits SET status = :status WHERE id = :id AND status = 'pending'

-- name: set_permit_status
UPDATE gov_permits SET status = :status WHERE id = :id

-- name: permit_to_settle
SELECT request, created_us, status FROM gov_permits WHERE id = :id

-- name: permit_status
SELECT status FROM gov_permits WHERE id = :id

-- name: permit_request
SELECT request FROM gov_permits WHERE id = :id

-- name: settlement
SELECT * FROM gov_settlements WHERE permit_id = :permit_id

-- name: settle_charge
UPDATE gov_charges SET committed = :committed, liability = :liability
 WHERE permit_id = :permit_id AND seq = :seq

-- name: insert_settlement
INSERT INTO gov_settlements (permit_id, kind, fingerprint, tokens_committed, usd_committed,
                             detail, settled_us, tokens_liability, usd_liability,
                             bound_exceeded)
VALUES (:permit_id, :kind, :fingerprint, :tokens_committed, :usd_committed, :detail,
        :settled_us, :tokens_liability, :usd_liability, :bound_exceeded)

-- name: insert_permit_facts
INSERT OR IGNORE INTO gov_permit_facts (permit_id, route, deployment, client, http_status,
                                        input, output, cache_read, cache_write_5m,
                                        cache_write_1h, cache_write_unknown)
VALUES (:permit_id, :route, :deployment, :client, :http_status, :input, :output,
        :cache_read, :cache_write_5m, :cache_write_1h, :cache_write_unknown)

-- name: settled_permit
-- A settled permit's request and outcome kind (resolving its liability).
SELECT p.request, s.kind
  FROM gov_permits p JOIN gov_settlements s ON s.permit_id = p.id
 WHERE p.id = :id

-- name: charge_figures
SELECT committed, liability FROM gov_charges WHERE permit_id = :permit_id AND seq = :seq

-- name: resolve_settlement
UPDATE gov_settlements
   SET kind = :kind, fingerprint = :fingerprint, tokens_committed = :tokens_committed,
       usd_committed = :usd_committed, tokens_liability = :tokens_liability,
       usd_liability = :usd_liability, bound_exceeded = :bound_exceeded,
       detail = :detail, resolved_us = :resolved_us
 WHERE permit_id = :permit_id

-- name: pending_permits
SELECT id FROM gov_permits WHERE status = 'pending' ORDER BY created_us

-- name: permit_info
-- One permit as an operator sees it (gateway/governance/_ops.py).
SELECT p.id, p.request_id, p.key_id, p.team_id, p.user, p.model, p.token_bound,
       p.usd_bound, p.created_us, coalesce(s.kind, 'pending') AS status,
       s.tokens_committed, s.usd_committed, s.detail, s.tokens_liability,
       s.usd_liability, s.bound_exceeded, f.route, f.deployment, f.client, f.http_status,
       f.input AS input_tokens, f.output AS output_tokens, f.cache_read AS cache_read_tokens,
       f.cache_write_5m AS cache_write_5m_tokens, f.cache_write_1h AS cache_write_1h_tokens,
       f.cache_write_unknown AS cache_write_unknown_tokens, t.tier
  FROM gov_permits p LEFT JOIN gov_settlements s ON s.permit_id = p.id
       LEFT JOIN gov_permit_facts f ON f.permit_id = p.id
       LEFT JOIN gov_permit_tiers t ON t.permit_id = p.id
 WHERE p.id = :id

-- name: permits
-- Permits oldest first, as permit_info: only pending ones if :pending_only, only those
-- admitted at or before :created_before (µs) unless NULL, at most :limit unless NULL.
SELECT p.id, p.request_id, p.key_id, p.team_id, p.user, p.model, p.token_bound,
       p.usd_bound, p.created_us, coalesce(s.kind, 'pending') AS status,
       s.tokens_committed, s.usd_committed, s.detail, s.tokens_liability,
       s.usd_liability, s.bound_exceeded, f.route, f.deployment, f.client, f.http_status,
       f.input AS input_tokens, f.output AS output_tokens, f.cache_read AS cache_read_tokens,
       f.cache_write_5m AS cache_write_5m_tokens, f.cache_write_1h AS cache_write_1h_tokens,
       f.cache_write_unknown AS cache_write_unknown_tokens, t.tier
  FROM gov_permits p LEFT JOIN gov_settlements s ON s.permit_id = p.id
       LEFT JOIN gov_permit_facts f ON f.permit_id = p.id
       LEFT JOIN gov_permit_tiers t ON t.permit_id = p.id
 WHERE (NOT :pending_only OR p.status = 'pending')
   AND (:created_before IS NULL OR p.created_us <= :created_before)
 ORDER BY p.created_us, p.id
 LIMIT coalesce(:limit, -1)

-- name: request_log
-- The request log (GET /admin/v1/requests): permits newest first, as permit_info, each
-- filter applied unless NULL; :before_us/:before_id is the page position. The time
-- bounds and the position's time are ranges (an absent one open), not "IS NULL OR", so
-- that SQLite's one plan for every parameter reads gov_permits_created from there.
SELECT * FROM (
    SELECT p.id, p.request_id, p.key_id, p.team_id, p.user, p.model, p.token_bound,
           p.usd_bound, p.created_us, coalesce(s.kind, 'pending') AS status,
           s.tokens_committed, s.usd_committed, s.detail, s.tokens_liability,
           s.usd_liability, s.bound_exceeded, f.route, f.deployment, f.client, f.http_status,
           f.input AS input_tokens, f.output AS output_tokens, f.cache_read AS cache_read_tokens,
           f.cache_write_5m AS cache_write_5m_tokens, f.cache_write_1h AS cache_write_1h_tokens,
           f.cache_write_unknown AS cache_write_unknown_tokens, t.tier
      FROM gov_permits p LEFT JOIN gov_settlements s ON s.permit_id = p.id
           LEFT JOIN gov_permit_facts f ON f.permit_id = p.id
           LEFT JOIN gov_permit_tiers t ON t.permit_id = p.id
     WHERE (:team_id IS NULL OR p.team_id = :team_id)
       AND (:key_id IS NULL OR p.key_id = :key_id)
       AND (:user IS NULL OR p.user = :user)
       AND (:model IS NULL OR p.model = :model)
       AND (:client IS NULL OR f.client = :client)
       AND p.created_us >= coalesce(:since_us, -9223372036854775807)
       AND p.created_us < coalesce(:until_us, 9223372036854775807)
       AND p.created_us <= coalesce(:before_us, 9223372036854775807)
       AND (:before_us IS NULL OR p.created_us < :before_us
            OR (p.created_us = :before_us AND p.id < :before_id))
) WHERE (:status IS NULL OR status = :status)
 ORDER BY created_us DESC, id DESC
 LIMIT coalesce(:limit, -1)

-- name: request_summary
-- The request log summed (GET /admin/v1/requests/summary), as the Postgres
-- request_summary: per asked group (NULL when not asked) and UTC period; settled:
-- committed and liability apart; pending or invalid: the bounds as reserved; cancelled:
-- no request. The filters are request_log's.
SELECT CASE WHEN :by_team THEN team_id END AS team_id,
       CASE WHEN :by_user THEN user END AS user,
       CASE WHEN :by_key THEN key_id END AS key_id,
       CASE WHEN :by_model THEN model END AS model,
       CASE WHEN :by_tool THEN client END AS tool,
       CASE :bucket
            WHEN 'day' THEN strftime('%Y-%m-%d', created_us / 1000000, 'unixepoch')
            WHEN 'hour' THEN strftime('%Y-%m-%dT%H', created_us / 1000000, 'unixepoch')
       END AS period,
       coalesce(sum(status <> 'cancelled'), 0) AS requests,
       coalesce(sum(CASE WHEN NOT reserved THEN tokens_committed END), 0) AS tokens_committed,
       coalesce(sum(CASE WHEN NOT reserved THEN usd_committed END), 0) AS usd_committed,
       coalesce(sum(CASE WHEN NOT reserved THEN tokens_liability END), 0) AS tokens_liability,
       coalesce(sum(CASE WHEN NOT reserved THEN usd_liability END), 0) AS usd_liability,
       coalesce(sum(CASE WHEN reserved THEN token_bound END), 0) AS tokens_reserved,
       coalesce(sum(CASE WHEN reserved THEN usd_bound END), 0) AS usd_reserved
  FROM (
    SELECT p.team_id, p.user, p.key_id, p.model, f.client, p.created_us, p.token_bound,
           p.usd_bound, coalesce(s.kind, 'pending') AS status,
           coalesce(s.kind, 'pending') IN ('pending', 'invalid') AS reserved,
           s.tokens_committed, s.usd_committed, s.tokens_liability, s.usd_liability
      FROM gov_permits p LEFT JOIN gov_settlements s ON s.permit_id = p.id
           LEFT JOIN gov_permit_facts f ON f.permit_id = p.id
     WHERE (:team_id IS NULL OR p.team_id = :team_id)
       AND (:key_id IS NULL OR p.key_id = :key_id)
       AND (:user IS NULL OR p.user = :user)
       AND (:model IS NULL OR p.model = :model)
       AND (:client IS NULL OR f.client = :client)
       AND p.created_us >= coalesce(:since_us, -9223372036854775807)
       AND p.created_us < coalesce(:until_us, 9223372036854775807)
) WHERE (:status IS NULL OR status = :status)
 GROUP BY 1, 2, 3, 4, 5, 6

-- name: usage
-- GET /v1/usage (gateway/governance/_usage.py): one row per scope (0 key, 1 team,
-- 2 user), window (0: the day :day, 1: the month :month) and id, in that order. A
-- permit counts in the windows it was admitted in; pending and invalid ones count their
-- bounds as reserved, settled ones what settlement committed and, apart, their
-- liability; a request cancelled before dispatch is not counted as a request.
-- Filtered by :key_id and :team_id (either may be NULL): key and user rows follow the
-- key (else the team), team rows the team (else the teams of the key's permits).
WITH permits AS (
    SELECT 0 AS win, id, key_id, team_id, user, status, token_bound, usd_bound
      FROM gov_permits WHERE day = :day
    UNION ALL
    SELECT 1, id, key_id, team_id, user, status, token_bound, usd_bound
      FROM gov_permits WHERE month = :month
), scoped AS (
    SELECT 0 AS scope, key_id AS owner, * FROM permits
     WHERE CASE WHEN :key_id IS NOT NULL THEN key_id = :key_id
                WHEN :team_id IS NOT NULL THEN team_id = :team_id ELSE 1 END
    UNION ALL
    SELECT 1, team_id, * FROM permits
     WHERE CASE WHEN :team_id IS NOT NULL THEN team_id = :team_id
                WHEN :key_id IS NOT NULL
                THEN team_id IN (SELECT team_id FROM gov_permits WHERE key_id = :key_id)
                ELSE 1 END
    UNION ALL
    SELECT 2, user, * FROM permits
     WHERE CASE WHEN :key_id IS NOT NULL THEN key_id = :key_id
                WHEN :team_id IS NOT NULL THEN team_id = :team_id ELSE 1 END
)
SELECT x.scope, x.win, x.owner AS id,
       SUM(CASE WHEN x.status = 'settled' THEN s.tokens_committed ELSE 0 END) AS tc,
       SUM(CASE WHEN x.status = 'settled' THEN 0 ELSE x.token_bound END) AS tr,
       SUM(CASE WHEN x.status = 'settled' THEN s.usd_committed ELSE 0 END) AS uc,
       SUM(CASE WHEN x.status = 'settled' THEN 0 ELSE x.usd_bound END) AS ur,
       SUM(CASE WHEN x.status = 'settled' THEN s.tokens_liability ELSE 0 END) AS tl,
       SUM(CASE WHEN x.status = 'settled' THEN s.usd_liability ELSE 0 END) AS ul,
       SUM(CASE WHEN s.kind = 'cancelled' THEN 0 ELSE 1 END) AS requests
  FROM scoped x LEFT JOIN gov_settlements s ON s.permit_id = x.id
 WHERE x.owner IS NOT NULL
 GROUP BY x.scope, x.win, x.owner
 ORDER BY x.scope, x.win, x.owner

-- name: import_tables
-- mayu keys import (gateway/keys/_import_spend.py): whether the file holds the
-- governance tables, i.e. has spend to move (a key-store-only file has none).
SELECT count(*) FROM sqlite_master
 WHERE type = 'table' AND name IN ('gov_counters', 'gov_permits', 'gov_charges',
                                   'gov_settlements')

-- name: import_pending
-- mayu keys import: the permits still pending (their number and the oldest id): a
-- running or crashed gateway's, which the import refuses to guess an outcome for.
SELECT count(*) AS pending, min(id) AS oldest FROM gov_permits WHERE status = 'pending'

-- name: import_permits
-- mayu keys import: every permit admitted in the month :month, with its settlement
-- (pending ones are refused before), oldest first.
SELECT p.id, p.request, p.created_us, s.kind, s.fingerprint, s.detail, s.settled_us,
       s.resolved_us, s.tokens_committed, s.usd_committed, s.tokens_liability,
       s.usd_liability, s.bound_exceeded
  FROM gov_permits p JOIN gov_settlements s ON s.permit_id = p.id
 WHERE p.month = :month
 ORDER BY p.created_us, p.id

-- name: import_charges
-- mayu keys import: what settlement wrote on each charge of those permits (by seq, the
-- charge's index in the permit's request).
SELECT g.permit_id, g.seq, g.committed, g.liability
  FROM gov_charges g JOIN gov_permits p ON p.id = g.permit_id
 WHERE p.month = :month AND p.status <> 'pending'

-- name: import_counters
-- mayu keys import: the calendar windows and accounts those permits charged, as stored,
-- to check that the permits account for every µUSD and token the counters hold.
SELECT counter, reserved, committed, liability, frozen_by FROM gov_counters
 WHERE kind <> 'bucket' AND counter IN (
       SELECT g.counter FROM gov_charges g JOIN gov_permits p ON p.id = g.permit_id
        WHERE p.month = :month AND p.status <> 'pending')

-- name: prunable_permits
-- Request-log retention: settled permits admitted before :before_us whose month window
-- has ended (month < :month), oldest first, at most :limit (see sql/queries.sql).
SELECT id FROM gov_permits
 WHERE status <> 'pending' AND month < :month AND created_us < :before_us
 ORDER BY created_us LIMIT :limit

-- name: prune_charges
DELETE FROM gov_charges WHERE permit_id = :id

-- name: prune_settlement
DELETE FROM gov_settlements WHERE permit_id = :id

-- name: prune_facts
DELETE FROM gov_permit_facts WHERE permit_id = :id

-- name: prune_tier
DELETE FROM gov_permit_tiers WHERE permit_id = :id

-- name: insert_permit_tier
INSERT OR IGNORE INTO gov_permit_tiers (permit_id, tier) VALUES (:permit_id, :tier)

-- name: prune_permit
DELETE FROM gov_permits WHERE id = :id

-- name: key_last_used
-- A key's newest permit, µs since the epoch (the admin API's last_used_at).
SELECT max(created_us) AS last_us FROM gov_permits WHERE key_id = :key_id
