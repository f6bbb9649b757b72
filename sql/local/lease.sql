-- The lease profile's bookkeeping in the plane's SQLite file (gateway/lease/_local.py),
-- beside the governance store's tables: the plane's frame and id, the last applied
-- policy set, and the figures of the local account: counters read for each heartbeat.
-- Each statement starts with a "-- name: <name>" line; parameters are :name (sqlite3).
-- "schema" is run with executescript when the file opens (gateway/localdb.py).
-- The schema is the present one only: a file created by a pre-release build whose
-- tables lack one of these columns is refused when the file opens, naming the table
-- and the columns (gateway/localdb.py); nothing is altered in place.

-- name: schema
CREATE TABLE IF NOT EXISTS lease_plane (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    frame TEXT NOT NULL,                     -- random, born with the counters
    dataplane_id TEXT NOT NULL,
    namespace TEXT, generation INTEGER, fingerprint TEXT,
    documents TEXT,                          -- the last applied set, JSON {name: document}
    saved_at TEXT
);

-- name: create_plane
-- The plane's row, on first use only.
INSERT OR IGNORE INTO lease_plane (singleton, frame, dataplane_id)
VALUES (1, :frame, :dataplane_id)

-- name: set_dataplane_id
UPDATE lease_plane SET dataplane_id = :dataplane_id

-- name: plane
SELECT frame, dataplane_id FROM lease_plane

-- name: saved_policy
SELECT namespace, generation, fingerprint, documents FROM lease_plane

-- name: save_policy
UPDATE lease_plane
   SET namespace = :namespace, generation = :generation, fingerprint = :fingerprint,
       documents = :documents, saved_at = datetime('now')

-- name: account_figures
-- Every local account: counter (gov_counters is the governance store's table: absent
-- from a file that store never opened).
SELECT counter, committed, liability, reserved FROM gov_counters WHERE kind = 'account'
