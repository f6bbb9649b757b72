-- Budget alerts (ADR-050) in the local profile's SQLite file (gateway/alerts/_stores.py),
-- beside the governance store's gov_counters: one replica, so the table only keeps an
-- event from being delivered twice, across restarts too.
-- Each statement starts with a "-- name: <name>" line; parameters are :name (sqlite3).
-- "schema" is run with executescript when the store opens (gateway/localdb.py).
-- The schema is the present one only: a file created by a pre-release build whose
-- tables lack one of these columns is refused when the store opens, naming the table
-- and the columns (gateway/localdb.py); nothing is altered in place.

-- name: schema
CREATE TABLE IF NOT EXISTS alert_events (
    counter TEXT NOT NULL,
    "window" TEXT NOT NULL,
    threshold INTEGER NOT NULL CHECK (threshold IN (80, 90, 100)),
    "limit" INTEGER NOT NULL,
    committed INTEGER NOT NULL,
    liability INTEGER NOT NULL,
    reserved INTEGER NOT NULL,
    replica TEXT NOT NULL,
    first_seen_at TEXT NOT NULL,
    delivered_at TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    PRIMARY KEY (counter, "window", threshold)
);

-- name: figures
-- One money window or account of the local governance store (gateway/governance/_local.py).
SELECT committed, liability, reserved FROM gov_counters WHERE counter = :counter

-- name: claimed
-- The thresholds already claimed for one budget and window.
SELECT threshold FROM alert_events WHERE counter = :counter AND "window" = :window

-- name: claim
INSERT INTO alert_events (counter, "window", threshold, "limit", committed, liability,
                          reserved, replica, first_seen_at)
VALUES (:counter, :window, :threshold, :limit, :committed, :liability, :reserved,
        :replica, :first_seen_at)
ON CONFLICT (counter, "window", threshold) DO NOTHING
RETURNING counter

-- name: delivered
UPDATE alert_events
   SET delivered_at = CASE WHEN :ok THEN :at END, attempts = attempts + :attempts,
       last_error = :error
 WHERE counter = :counter AND "window" = :window AND threshold = :threshold

-- name: fired
-- The events first seen at or after :since (the same text format), newest first.
SELECT counter, "window", threshold, "limit", committed, liability, reserved, replica,
       first_seen_at
  FROM alert_events
 WHERE first_seen_at >= :since
 ORDER BY first_seen_at DESC, counter, threshold
 LIMIT :limit
