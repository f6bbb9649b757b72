-- The agents' own usage reports in the shared database (client_usage_reports,
-- gateway/otlp_import): stored by the OTLP receiver, read by the usage API beside the
-- request log. Never read by admission or settlement.
-- Each query starts with a "-- name: <name>" line; parameters are %(name)s.

-- name: add_reports
-- One export's reports, each stored once: a replayed event id changes nothing.
-- Returns the ids this call stored.
INSERT INTO client_usage_reports (event_id, team_id, key_id, user_name, agent, signal,
                                  session_id, model, input_tokens, output_tokens,
                                  cache_read_tokens, cache_write_tokens,
                                  reported_cost_uusd, reported_at)
SELECT r.event_id, %(team_id)s, %(key_id)s, %(user)s, r.agent, r.signal, r.session_id,
       r.model, r.input_tokens, r.output_tokens, r.cache_read_tokens, r.cache_write_tokens,
       r.reported_cost_uusd, r.reported_at
  FROM jsonb_to_recordset(%(reports)s::jsonb) AS r (
       event_id text, agent text, signal text, session_id text, model text,
       input_tokens bigint, output_tokens bigint, cache_read_tokens bigint,
       cache_write_tokens bigint, reported_cost_uusd bigint, reported_at timestamptz)
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id

-- name: reported_summary
-- The reports summed per asked group (a group not asked is NULL) and UTC day of the
-- agent's own event time (NULL for bucket 'none'). A session's metric points count
-- only when none of its log events arrived (both report the same requests).
SELECT CASE WHEN %(by_team)s THEN team_id END AS team_id,
       CASE WHEN %(by_user)s THEN user_name END AS "user",
       CASE WHEN %(by_key)s THEN key_id END AS key_id,
       CASE WHEN %(by_session)s THEN session_id END AS session_id,
       CASE WHEN %(by_agent)s THEN agent END AS agent,
       CASE %(bucket)s::text
            WHEN 'day' THEN to_char(reported_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')
       END AS period,
       count(*)::bigint AS reports,
       sum(input_tokens)::bigint AS input_tokens,
       sum(output_tokens)::bigint AS output_tokens,
       sum(cache_read_tokens)::bigint AS cache_read_tokens,
       sum(cache_write_tokens)::bigint AS cache_write_tokens,
       sum(reported_cost_uusd)::bigint AS reported_cost_uusd,  -- NULL: none reported
       min(reported_at) AS first_at,
       max(reported_at) AS last_at
  FROM client_usage_reports r
 WHERE (%(team_id)s::text IS NULL OR team_id = %(team_id)s)
   AND (%(key_id)s::text IS NULL OR key_id = %(key_id)s)
   AND (%(user)s::text IS NULL OR user_name = %(user)s)
   AND (%(session_id)s::text IS NULL OR session_id = %(session_id)s)
   AND reported_at >= coalesce(%(since)s::timestamptz, '-infinity')
   AND reported_at < coalesce(%(until)s::timestamptz, 'infinity')
   AND (signal = 'event' OR NOT EXISTS (
        SELECT 1 FROM client_usage_reports e
         WHERE e.key_id = r.key_id AND e.session_id IS NOT DISTINCT FROM r.session_id
           AND e.signal = 'event'))
 GROUP BY 1, 2, 3, 4, 5, 6

-- name: prune_reports
-- Retention (governance_store.retention_days, as the request log's): the reports whose
-- event time is before %(before)s, the caller's cutoff (never in the current UTC month).
DELETE FROM client_usage_reports WHERE reported_at < %(before)s
