-- The agents' own usage reports in the local profile's SQLite file (gateway/otlp_import),
-- beside the governance store's request log (gov_permits): stored by the OTLP receiver,
-- read by the usage API; never read by admission or settlement. The same table and
-- statements as sql/agent_usage_queries.sql; times are UTC text
-- (YYYY-MM-DDTHH:MM:SS.ffffffZ), so they sort and compare as text.
-- Each statement starts with a "-- name: <name>" line; parameters are :name (sqlite3).
-- "schema" is run with executescript when the store opens (gateway/localdb.py).

-- name: schema
CREATE TABLE IF NOT EXISTS client_usage_reports (
    event_id TEXT PRIMARY KEY,
    team_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    user_name TEXT,
    agent TEXT NOT NULL,
    signal TEXT NOT NULL CHECK (signal IN ('event', 'metric')),
    session_id TEXT,
    model TEXT,
    input_tokens INTEGER NOT NULL CHECK (input_tokens >= 0),
    output_tokens INTEGER NOT NULL CHECK (output_tokens >= 0),
    cache_read_tokens INTEGER NOT NULL CHECK (cache_read_tokens >= 0),
    cache_write_tokens INTEGER NOT NULL CHECK (cache_write_tokens >= 0),
    reported_cost_uusd INTEGER CHECK (reported_cost_uusd >= 0),
    reported_at TEXT NOT NULL,
    received_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS client_usage_reports_team_idx
    ON client_usage_reports (team_id, reported_at);
CREATE INDEX IF NOT EXISTS client_usage_reports_key_idx
    ON client_usage_reports (key_id, reported_at);

-- name: add_report
-- One report, stored once: a replayed event id changes nothing (returns no row).
INSERT INTO client_usage_reports (event_id, team_id, key_id, user_name, agent, signal,
                                  session_id, model, input_tokens, output_tokens,
                                  cache_read_tokens, cache_write_tokens,
                                  reported_cost_uusd, reported_at, received_at)
VALUES (:event_id, :team_id, :key_id, :user, :agent, :signal, :session_id, :model,
        :input_tokens, :output_tokens, :cache_read_tokens, :cache_write_tokens,
        :reported_cost_uusd, :reported_at, :received_at)
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id

-- name: reported_summary
-- As sql/agent_usage_queries.sql's reported_summary.
SELECT CASE WHEN :by_team THEN team_id END AS team_id,
       CASE WHEN :by_user THEN user_name END AS "user",
       CASE WHEN :by_key THEN key_id END AS key_id,
       CASE WHEN :by_session THEN session_id END AS session_id,
       CASE WHEN :by_agent THEN agent END AS agent,
       CASE WHEN :bucket = 'day' THEN substr(reported_at, 1, 10) END AS period,
       count(*) AS reports,
       sum(input_tokens) AS input_tokens,
       sum(output_tokens) AS output_tokens,
       sum(cache_read_tokens) AS cache_read_tokens,
       sum(cache_write_tokens) AS cache_write_tokens,
       sum(reported_cost_uusd) AS reported_cost_uusd,
       min(reported_at) AS first_at,
       max(reported_at) AS last_at
  FROM client_usage_reports r
 WHERE (:team_id IS NULL OR team_id = :team_id)
   AND (:key_id IS NULL OR key_id = :key_id)
   AND (:user IS NULL OR user_name = :user)
   AND (:session_id IS NULL OR session_id = :session_id)
   AND (:since IS NULL OR reported_at >= :since)
   AND (:until IS NULL OR reported_at < :until)
   AND (signal = 'event' OR NOT EXISTS (
        SELECT 1 FROM client_usage_reports e
         WHERE e.key_id = r.key_id AND e.session_id IS r.session_id
           AND e.signal = 'event'))
 GROUP BY 1, 2, 3, 4, 5, 6

-- name: prune_reports
-- As sql/agent_usage_queries.sql's prune_reports (:before in the same text format).
DELETE FROM client_usage_reports WHERE reported_at < :before
