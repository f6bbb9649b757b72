-- The lease plane's usage spool in its SQLite file (gateway/lease/_spool.py): the ids of
-- settled permits whose usage record inferplaned has not acknowledged yet. The record
-- itself is read from the governance store's tables (gov_permits, gov_settlements,
-- gov_permit_facts) when a batch is built, so the spool holds no second copy and never
-- a payload (those tables hold none either).
-- Each statement starts with a "-- name: <name>" line; parameters are :name (sqlite3).
-- "schema" is run with executescript when the spool opens (gateway/localdb.py);
-- the "trigger_*" statements right after, once the governance store's tables exist.

-- name: schema
CREATE TABLE IF NOT EXISTS usage_spool (
    seq INTEGER PRIMARY KEY,                 -- settlement order
    permit_id TEXT NOT NULL UNIQUE
);
-- One row: the bound on queued ids, how many are queued, and how many settled permits
-- were never queued because the spool was full (cumulative, kept across restarts).
CREATE TABLE IF NOT EXISTS usage_spool_state (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    bound INTEGER NOT NULL,
    queued INTEGER NOT NULL DEFAULT 0,
    dropped INTEGER NOT NULL DEFAULT 0
);

-- name: trigger_settled
-- A settlement queues its permit in the settlement's own transaction (nothing settled
-- is missed by a crash in between), unless the spool holds its bound already: then it
-- is counted as dropped instead. Never an error on the request path (OR IGNORE).
CREATE TRIGGER IF NOT EXISTS usage_spool_settled AFTER INSERT ON gov_settlements
BEGIN
    UPDATE usage_spool_state SET dropped = dropped + 1 WHERE queued >= bound;
    INSERT OR IGNORE INTO usage_spool (permit_id)
    SELECT new.permit_id FROM usage_spool_state WHERE queued < bound;
END

-- name: trigger_queued
CREATE TRIGGER IF NOT EXISTS usage_spool_queued AFTER INSERT ON usage_spool
BEGIN
    UPDATE usage_spool_state SET queued = queued + 1;
END

-- name: trigger_acked
CREATE TRIGGER IF NOT EXISTS usage_spool_acked AFTER DELETE ON usage_spool
BEGIN
    UPDATE usage_spool_state SET queued = queued - 1;
END

-- name: init_state
INSERT OR IGNORE INTO usage_spool_state (singleton, bound) VALUES (1, :bound)

-- name: set_bound
UPDATE usage_spool_state SET bound = :bound

-- name: state
SELECT bound, queued, dropped FROM usage_spool_state

-- name: batch
-- The oldest queued ids with what the request log holds of them (NULL columns: a
-- permit pruned before it was shipped).
SELECT s.seq, s.permit_id, p.request_id, p.key_id, p.team_id, p.user, p.model, p.day,
       p.month, p.token_bound, p.usd_bound, p.request, p.created_us, st.kind,
       st.fingerprint, st.tokens_committed, st.usd_committed, st.tokens_liability,
       st.usd_liability, st.bound_exceeded, st.detail, st.settled_us, st.resolved_us,
       f.route, f.deployment, f.client, f.http_status, f.input, f.output, f.cache_read,
       f.cache_write_5m, f.cache_write_1h, f.cache_write_unknown
  FROM usage_spool s
       LEFT JOIN gov_permits p ON p.id = s.permit_id
       LEFT JOIN gov_settlements st ON st.permit_id = s.permit_id
       LEFT JOIN gov_permit_facts f ON f.permit_id = s.permit_id
 ORDER BY s.seq
 LIMIT :limit

-- name: ack
DELETE FROM usage_spool WHERE permit_id = :permit_id

-- name: count_dropped
-- Records removed without being stored (pruned before shipping, refused by inferplaned).
UPDATE usage_spool_state SET dropped = dropped + :count

-- name: plane
-- The plane's id, as the lease client keeps it (sql/local/lease.sql; absent until the
-- client first opened the file).
SELECT dataplane_id FROM lease_plane
