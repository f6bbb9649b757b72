-- inferplaned's side of the usage protocol (controlplane/usage.py, POST /v1alpha1/usage):
-- lease planes' settled requests stored in the request log the shared profile writes
-- (permits and permit_facts), each marked with its plane. Counters and policy accounts
-- are NOT charged here: a plane's spend reaches the ledger through its heartbeat
-- (sql/lease.sql); these rows only explain it, request by request.
-- Each statement starts with a "-- name: <name>" line; parameters are %(name)s.

-- name: store_usage
-- One batch (a JSON array of gateway.lease.UsageRecord) in one statement: every record
-- whose id is not in the log yet is inserted with its facts; one row per record of the
-- batch answers how it stands: 'stored' (now), 'present' (held already for this plane: a
-- replayed batch) or 'conflict' (the id is held for another plane or the shared
-- profile, and is left alone). A record whose id another transaction is inserting at
-- the same moment waits for it and then answers nothing (the plane sends it again). The
-- team is the shared team of that name when there is one, else the name itself.
WITH x AS (
    SELECT *
      FROM jsonb_to_recordset(%(records)s::jsonb)
           AS r(id uuid, request_id text, key_id text, team text, "user" text, model text,
                status text, generation bigint, day text, month text, token_bound bigint,
                usd_bound bigint, created_us bigint, settled_us bigint, resolved_us bigint,
                fingerprint text, tokens_committed bigint, usd_committed bigint,
                tokens_liability bigint, usd_liability bigint, bound_exceeded boolean,
                detail text, route text, deployment text, client text, http_status integer,
                input bigint, output bigint, cache_read bigint, cache_write_5m bigint,
                cache_write_1h bigint, cache_write_unknown bigint)
), stored AS (
    INSERT INTO permits (id, request_id, key_id, team_id, user_name, model, token_bound,
                         usd_bound, generation, day, month, status, settle_fingerprint,
                         detail, tokens_committed, usd_committed, tokens_liability,
                         usd_liability, bound_exceeded, admitted_us, created_at,
                         settled_at, resolved_at, plane)
    SELECT x.id, x.request_id, x.key_id,
           coalesce((SELECT t.id FROM teams t WHERE t.name = x.team), x.team), x."user",
           x.model, x.token_bound, x.usd_bound, x.generation, x.day, x.month, x.status,
           x.fingerprint, nullif(x.detail, ''), x.tokens_committed, x.usd_committed,
           x.tokens_liability, x.usd_liability, coalesce(x.bound_exceeded, false),
           x.created_us, timestamptz 'epoch' + x.created_us * interval '1 microsecond',
           timestamptz 'epoch' + x.settled_us * interval '1 microsecond',
           timestamptz 'epoch' + x.resolved_us * interval '1 microsecond', %(plane)s
      FROM x
     ORDER BY x.id
    ON CONFLICT (id) DO NOTHING
    RETURNING id
), facts AS (
    INSERT INTO permit_facts (permit_id, route, deployment, client, http_status, input,
                              output, cache_read, cache_write_5m, cache_write_1h,
                              cache_write_unknown)
    SELECT x.id, x.route, x.deployment, x.client, x.http_status, x.input, x.output,
           x.cache_read, x.cache_write_5m, x.cache_write_1h, x.cache_write_unknown
      FROM x
     WHERE x.id IN (SELECT id FROM stored)
       AND num_nonnulls(x.route, x.deployment, x.client, x.http_status, x.input,
                        x.output, x.cache_read, x.cache_write_5m, x.cache_write_1h,
                        x.cache_write_unknown) > 0
    ON CONFLICT (permit_id) DO NOTHING
)
SELECT replace(s.id::text, '-', '') AS id, 'stored' AS state FROM stored s
UNION ALL
SELECT replace(p.id::text, '-', ''),
       CASE WHEN p.plane IS NOT DISTINCT FROM %(plane)s THEN 'present' ELSE 'conflict' END
  FROM permits p
 WHERE p.id IN (SELECT id FROM x) AND p.id NOT IN (SELECT id FROM stored)

-- name: usage_plane_token
-- The data-plane token a plane belongs to (its first heartbeat bound it): only that
-- token ships the plane's records. No row: the plane has not synced yet.
SELECT token_name FROM lease_dataplanes WHERE id = %(plane)s FOR SHARE
