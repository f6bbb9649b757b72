-- Budget alerts (ADR-050) and the cluster-wide gauges, on the shared database.
-- Each query starts with a "-- name: <name>" line; parameters are %(name)s.
-- Used by gateway/alerts/_stores.py and gateway/cluster_metrics.py.

-- name: budget_alerts
-- budgets: [{counter, kind ('window' | 'account'), window, limit}], the money budgets
-- a settlement just moved. For each, committed + liability (the figures that bind)
-- against its limit (the counter's current one: admission keeps it up to date; the
-- permit's captured one if the row has none). Every threshold reached is inserted once
-- per (counter, window, threshold) across all replicas: the statement whose INSERT
-- returns the row claims the event and delivers it. "crossed" lists every threshold
-- reached, claimed here or before, so a replica stops asking about finished budgets.
WITH wanted AS (
    SELECT * FROM jsonb_to_recordset(%(budgets)s::jsonb)
        AS w(counter text, kind text, "window" text, "limit" bigint)
), figures AS (
    SELECT w.counter, w."window", coalesce(c."limit", w."limit") AS "limit",
           c.committed, c.liability, c.reserved
      FROM wanted w JOIN counters c ON c.key = w.counter
     WHERE w.kind = 'window'
    UNION ALL
    SELECT w.counter, w."window", coalesce(a."limit", w."limit"),
           a.committed, a.liability, a.reserved
      FROM wanted w JOIN authority_accounts a ON a.key = w.counter
     WHERE w.kind = 'account'
), crossed AS (
    SELECT f.*, t.threshold
      FROM figures f CROSS JOIN (VALUES (80), (90), (100)) AS t(threshold)
     WHERE f."limit" > 0
       AND (f.committed + f.liability)::numeric * 100 >= f."limit"::numeric * t.threshold
), claimed AS (
    INSERT INTO alert_events AS e (counter, "window", threshold, "limit", committed,
                                   liability, reserved, replica)
    SELECT counter, "window", threshold, "limit", committed, liability, reserved,
           %(replica)s
      FROM crossed
    ON CONFLICT (counter, "window", threshold) DO NOTHING
    RETURNING e.counter, e."window", e.threshold::int AS threshold, e."limit",
              e.committed, e.liability, e.reserved, e.replica,
              to_char(e.first_seen_at AT TIME ZONE 'UTC',
                      'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS first_seen_at
)
SELECT (SELECT coalesce(jsonb_agg(to_jsonb(claimed)), '[]'::jsonb) FROM claimed) AS claimed,
       (SELECT coalesce(jsonb_agg(jsonb_build_array(counter, threshold)), '[]'::jsonb)
          FROM crossed) AS crossed

-- name: alert_delivered
-- What became of one event's webhook delivery (delivered_at stays NULL after a failure).
UPDATE alert_events
   SET delivered_at = CASE WHEN %(ok)s THEN clock_timestamp() END,
       attempts = attempts + %(attempts)s, last_error = %(error)s
 WHERE counter = %(counter)s AND "window" = %(window)s AND threshold = %(threshold)s

-- name: cluster_budgets
-- Every money window and account of the current day and month that has a limit, with
-- its three figures (team names: cluster_team_names).
SELECT c.key AS counter, c."window" AS period, c."limit" AS "limit", c.committed,
       c.liability, c.reserved
  FROM counters c
 WHERE c."window" IN (%(day)s, %(month)s) AND c.kind = 'window' AND c.dimension = 'usd'
   AND c."limit" > 0
UNION ALL
SELECT a.key, a.window_period, a."limit", a.committed, a.liability, a.reserved
  FROM authority_accounts a
 WHERE a.window_period IN (%(day)s, %(month)s) AND a."limit" > 0

-- name: cluster_team_names
-- The names of these teams (metrics_team_labels).
SELECT id, name FROM teams WHERE id = ANY(%(ids)s::text[])

-- name: cluster_status
-- Permits admitted and not settled (by any replica), the age of the oldest, and the
-- frozen money windows and accounts (invalid usage, waiting for mayu accounts unfreeze).
SELECT (SELECT count(*) FROM permits WHERE status = 'pending') AS pending_permits,
       (SELECT coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)
          FROM permits WHERE status = 'pending')::float8 AS oldest_pending_s,
       (SELECT count(*) FROM counters WHERE frozen)
       + (SELECT count(*) FROM authority_accounts WHERE frozen) AS frozen

-- name: fired_alerts
-- The alert events first seen at or after a time, newest first (the admin API's
-- /admin/v1/alerts and the console's Overview).
SELECT counter, "window", threshold::int AS threshold, "limit", committed, liability,
       reserved, replica,
       to_char(first_seen_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
           AS first_seen_at
  FROM alert_events
 WHERE first_seen_at >= %(since)s
 ORDER BY first_seen_at DESC, counter, threshold
 LIMIT %(limit)s
