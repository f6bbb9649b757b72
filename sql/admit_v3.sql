-- inferplane_admit_v3: admission decided set-based (issue 11; docs/hot-team.md step 2).
--
-- Same input, output, contract, arithmetic and lock order as inferplane_admit_v2 (which
-- stays installed and unchanged): a JSON array of gateway.governance.AdmissionRequest,
-- one result per request, in order ({"permit_id", "buckets"} or a refusal with its
-- figures). What changes is the work done while the counter rows are locked: v2 runs a
-- handful of statements per charge (lock, check, reserve, balances, segment insert)
-- and walks a jsonb document for each; v3 runs a fixed number of statements per BATCH
-- whatever its size, and decides in memory:
--   1. the requests and their charges parsed once into typed arrays;
--   2. keys, teams FOR SHARE, policy_state FOR SHARE, and every snapshot check in one join
--      (inferplane_snapshot_v3);
--   3. the batch's accounts, then its counters, each locked by ONE sorted
--      SELECT ... FOR UPDATE into arrays (accounts before counters: every "account:" key
--      sorts before every counter key, the global order). If a row is missing (a new
--      window, a new team), the batch instead takes v1's per-row path for the whole
--      sorted pass (inferplane_lock_charge_v1: lock, else insert and lock, row by row),
--      so a creation interleaves with v2 transactions and lease syncs exactly as theirs do;
--   4. database time read once with every lock held; each request checked and reserved
--      on the running in-memory state, in batch order (a later request sees the earlier
--      ones' reservations), with the arithmetic of inferplane_check_charge_v2 and
--      inferplane_reserve_charge_v1;
--   5. one UPDATE per table for the rows the batch changed, one INSERT for its permits and
--      one for their segments.
-- Frozen once released; a change is inferplane_admit_v4 in a new file and revision.

-- The definitions a batch was planned from, locked in the fixed order (keys, teams FOR
-- SHARE; policy_state FOR SHARE), and each request's snapshot checked with
-- inferplane_check_snapshot_v1's conditions in one join: NULL where still current, else
-- the 503 snapshot_mismatch refusal naming what changed. One element per request.
CREATE FUNCTION inferplane_snapshot_v3(p_requests json) RETURNS jsonb[]
LANGUAGE plpgsql AS $$
DECLARE
    cur_gen bigint;
    results jsonb[];
BEGIN
    PERFORM 1 FROM keys
     WHERE id IN (SELECT r.key_id FROM json_to_recordset(p_requests) AS r(key_id text))
     ORDER BY id COLLATE "C" FOR SHARE;
    PERFORM 1 FROM teams
     WHERE id IN (SELECT r.team_id FROM json_to_recordset(p_requests) AS r(team_id text))
     ORDER BY id COLLATE "C" FOR SHARE;
    SELECT ps.generation INTO cur_gen FROM policy_state ps FOR SHARE;
    SELECT array_agg(CASE
               WHEN k.id IS NULL OR k.revoked_at IS NOT NULL
                    OR (k.expires_at IS NOT NULL AND k.expires_at <= clock_timestamp())
                    OR k.revision <> q.key_revision OR k.team_id <> q.team_id
               THEN jsonb_build_object('status', 503, 'reason', 'snapshot_mismatch',
                                       'counter', 'key:' || q.key_id)
               WHEN t.revision IS DISTINCT FROM q.team_revision
               THEN jsonb_build_object('status', 503, 'reason', 'snapshot_mismatch',
                                       'counter', 'team:' || q.team_id)
               WHEN cur_gen <> q.policy_generation
               THEN jsonb_build_object('status', 503, 'reason', 'snapshot_mismatch',
                                       'counter', 'policy')
           END ORDER BY q.o)
      INTO results
      FROM ROWS FROM (json_to_recordset(p_requests)
                      AS (key_id text, key_revision bigint, team_id text,
                          team_revision bigint, policy_generation bigint))
           WITH ORDINALITY AS q(key_id, key_revision, team_id, team_revision,
                                policy_generation, o)
      LEFT JOIN keys k ON k.id = q.key_id
      LEFT JOIN teams t ON t.id = q.team_id;
    RETURN results;
END
$$;

-- Lock the accounts, then the counters, named in p_keys, each table by ONE
-- SELECT ... ORDER BY key COLLATE "C" FOR UPDATE (the global order: every "account:" key
-- sorts before every counter key), and return their rows as parallel arrays, accounts
-- first (acct true), each part in key order; a counter's leased is 0 and its hard true.
-- o_slots: for each element of p_for, its index in keys (NULL if not locked). Used by
-- inferplane_admit_v3, inferplane_settle_v3 and inferplane_settle_admit_v3.
CREATE FUNCTION inferplane_lock_rows_v3(
    p_keys text[], p_for text[],
    OUT o_keys text[], OUT o_acct boolean[], OUT o_balance bigint[], OUT o_updated_us bigint[],
    OUT o_reserved bigint[], OUT o_committed bigint[], OUT o_liability bigint[],
    OUT o_leased bigint[], OUT o_frozen boolean[], OUT o_lim bigint[], OUT o_hard boolean[],
    OUT o_slots int[])
LANGUAGE plpgsql AS $$
BEGIN
    SELECT coalesce(array_agg(a.key ORDER BY a.key COLLATE "C"), '{}'),
           coalesce(array_agg(true ORDER BY a.key COLLATE "C"), '{}'),
           coalesce(array_agg(NULL::bigint ORDER BY a.key COLLATE "C"), '{}'),
           coalesce(array_agg(NULL::bigint ORDER BY a.key COLLATE "C"), '{}'),
           coalesce(array_agg(a.reserved ORDER BY a.key COLLATE "C"), '{}'),
           coalesce(array_agg(a.committed ORDER BY a.key COLLATE "C"), '{}'),
           coalesce(array_agg(a.liability ORDER BY a.key COLLATE "C"), '{}'),
           coalesce(array_agg(a.leased_outstanding ORDER BY a.key COLLATE "C"), '{}'),
           coalesce(array_agg(a.frozen ORDER BY a.key COLLATE "C"), '{}'),
           coalesce(array_agg(a."limit" ORDER BY a.key COLLATE "C"), '{}'),
           coalesce(array_agg(a.hard ORDER BY a.key COLLATE "C"), '{}')
      INTO o_keys, o_acct, o_balance, o_updated_us, o_reserved, o_committed, o_liability,
           o_leased, o_frozen, o_lim, o_hard
      FROM (SELECT * FROM authority_accounts aa WHERE aa.key = ANY(p_keys)
             ORDER BY aa.key COLLATE "C" FOR UPDATE) a;
    SELECT o_keys || coalesce(array_agg(c.key ORDER BY c.key COLLATE "C"), '{}'),
           o_acct || coalesce(array_agg(false ORDER BY c.key COLLATE "C"), '{}'),
           o_balance || coalesce(array_agg(c.balance ORDER BY c.key COLLATE "C"), '{}'),
           o_updated_us || coalesce(array_agg(c.updated_us ORDER BY c.key COLLATE "C"), '{}'),
           o_reserved || coalesce(array_agg(c.reserved ORDER BY c.key COLLATE "C"), '{}'),
           o_committed || coalesce(array_agg(c.committed ORDER BY c.key COLLATE "C"), '{}'),
           o_liability || coalesce(array_agg(c.liability ORDER BY c.key COLLATE "C"), '{}'),
           o_leased || coalesce(array_agg(0::bigint ORDER BY c.key COLLATE "C"), '{}'),
           o_frozen || coalesce(array_agg(c.frozen ORDER BY c.key COLLATE "C"), '{}'),
           o_lim || coalesce(array_agg(c."limit" ORDER BY c.key COLLATE "C"), '{}'),
           o_hard || coalesce(array_agg(true ORDER BY c.key COLLATE "C"), '{}')
      INTO o_keys, o_acct, o_balance, o_updated_us, o_reserved, o_committed, o_liability,
           o_leased, o_frozen, o_lim, o_hard
      FROM (SELECT * FROM counters cc WHERE cc.key = ANY(p_keys)
             ORDER BY cc.key COLLATE "C" FOR UPDATE) c;
    SELECT coalesce(array_agg(array_position(o_keys, x.k) ORDER BY x.o), '{}') INTO o_slots
      FROM unnest(p_for) WITH ORDINALITY AS x(k, o);
END
$$;

CREATE FUNCTION inferplane_admit_v3(p_requests json) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    n int;
    r_first int[];
    r_last int[];
    c_req int[];
    c_counter text[];
    c_kind text[];
    c_dim text[];
    c_amount bigint[];
    c_limit bigint[];
    c_window text[];
    c_uid text[];
    c_hard boolean[];
    c_slot int[];
    -- The locked rows: accounts first, then counters, each sorted as locked.
    s_key text[];
    s_acct boolean[];
    s_balance bigint[];
    s_updated bigint[];
    s_reserved bigint[];
    s_committed bigint[];
    s_liability bigint[];
    s_leased bigint[];
    s_frozen boolean[];
    s_limit bigint[];
    s_hard boolean[];
    s_dirty boolean[];
    a_keys text[];
    k_keys text[];
    found_rows int;
    results jsonb[];
    granted int[] := '{}';
    pids uuid[] := '{}';
    now_us bigint;
    i int;
    j int;
    k int;
    amount bigint;
    cap bigint;
    bal bigint;
    money boolean;
    refusal jsonb;
    balances jsonb;
    pid uuid;
    ch jsonb;
BEGIN
    -- 1. Parse once.
    n := json_array_length(p_requests);
    IF n = 0 THEN
        RETURN '[]'::jsonb;
    END IF;
    SELECT array_agg(e.o::int ORDER BY e.o, c.o), array_agg(c.counter ORDER BY e.o, c.o),
           array_agg(c.kind ORDER BY e.o, c.o), array_agg(c.dimension ORDER BY e.o, c.o),
           array_agg(c.amount ORDER BY e.o, c.o), array_agg(c.lim ORDER BY e.o, c.o),
           array_agg(c.win ORDER BY e.o, c.o), array_agg(c.rule_uid ORDER BY e.o, c.o),
           array_agg(coalesce(c.hard, true) ORDER BY e.o, c.o)
      INTO c_req, c_counter, c_kind, c_dim, c_amount, c_limit, c_window, c_uid, c_hard
      FROM json_array_elements(p_requests) WITH ORDINALITY AS e(doc, o),
           ROWS FROM (json_to_recordset(e.doc->'charges')
                      AS (counter text, kind text, dimension text, amount bigint,
                          "limit" bigint, "window" text, rule_uid text, hard boolean))
           WITH ORDINALITY AS c(counter, kind, dimension, amount, lim, win, rule_uid,
                                hard, o);
    c_req := coalesce(c_req, '{}');
    r_first := array_fill(1, ARRAY[n]);
    r_last := array_fill(0, ARRAY[n]);
    FOR j IN 1..coalesce(array_length(c_req, 1), 0) LOOP
        IF r_last[c_req[j]] = 0 THEN
            r_first[c_req[j]] := j;
        END IF;
        r_last[c_req[j]] := j;
    END LOOP;

    -- 2. Definitions locked and every snapshot checked.
    results := inferplane_snapshot_v3(p_requests);

    -- 3. The rows the still-admissible requests charge, in one sorted pass.
    SELECT coalesce(array_agg(DISTINCT x.counter) FILTER (WHERE x.kind = 'account'), '{}'),
           coalesce(array_agg(DISTINCT x.counter) FILTER (WHERE x.kind <> 'account'), '{}')
      INTO a_keys, k_keys
      FROM unnest(c_req, c_counter, c_kind) AS x(req, counter, kind)
     WHERE results[x.req] IS NULL;
    now_us := inferplane_now_us_v1();
    SELECT (SELECT count(*) FROM authority_accounts WHERE key = ANY(a_keys))
           + (SELECT count(*) FROM counters WHERE key = ANY(k_keys))
      INTO found_rows;
    IF found_rows < cardinality(a_keys) + cardinality(k_keys) THEN
        -- Some row is new: v1's row-by-row path (creates it, ON CONFLICT a concurrent
        -- creator wins), in the same byte order, so creation never inverts a lock order.
        FOR ch IN
            SELECT DISTINCT ON (x.counter COLLATE "C")
                   jsonb_build_object('counter', x.counter, 'kind', x.kind,
                                      'dimension', x.dim, 'limit', x.lim, 'window', x.win,
                                      'rule_uid', x.uid, 'hard', x.hard)
              FROM unnest(c_req, c_counter, c_kind, c_dim, c_limit, c_window, c_uid, c_hard)
                   AS x(req, counter, kind, dim, lim, win, uid, hard)
             WHERE results[x.req] IS NULL
             ORDER BY x.counter COLLATE "C"
        LOOP
            PERFORM inferplane_lock_charge_v1(ch, now_us);
        END LOOP;
    END IF;
    -- Every row exists now; lock (or, after the row-by-row path, re-read under the locks
    -- already held) accounts, then counters, each in byte order.
    SELECT * INTO s_key, s_acct, s_balance, s_updated, s_reserved, s_committed, s_liability,
                  s_leased, s_frozen, s_limit, s_hard, c_slot
      FROM inferplane_lock_rows_v3(a_keys || k_keys, c_counter);
    s_dirty := array_fill(false, ARRAY[cardinality(s_key)]);
    -- Database time read with every lock held (see inferplane_admit_v1).
    now_us := inferplane_now_us_v1();

    -- 4. Each request all-or-none, in order, on the running state.
    FOR i IN 1..n LOOP
        CONTINUE WHEN results[i] IS NOT NULL;
        refusal := NULL;
        FOR j IN r_first[i]..r_last[i] LOOP
            k := c_slot[j];
            amount := c_amount[j];
            cap := c_limit[j];
            money := c_dim[j] = 'usd';
            IF c_kind[j] = 'bucket' THEN
                bal := inferplane_refill_v1(s_balance[k], cap, now_us - s_updated[k]);
                IF bal < least(amount, cap)::numeric * 60000000 THEN
                    refusal := jsonb_build_object(
                        'status', CASE WHEN money THEN 402 ELSE 429 END,
                        'reason', 'rate_limited', 'counter', c_counter[j],
                        'retry_after', inferplane_retry_after_v1(bal, cap, amount),
                        'limit', cap, 'amount', amount, 'dimension', c_dim[j]);
                    EXIT;
                END IF;
            ELSIF s_frozen[k] THEN
                refusal := jsonb_build_object('status', 402, 'reason', 'account_frozen',
                                              'counter', c_counter[j]);
                EXIT;
            ELSIF c_hard[j] AND cap IS NOT NULL
                  AND s_committed[k] + s_liability[k] + s_reserved[k] + s_leased[k]
                      + amount > cap THEN
                refusal := jsonb_build_object(
                    'status', CASE WHEN money THEN 402 ELSE 429 END,
                    'reason', CASE WHEN money THEN 'budget_exhausted'
                                   ELSE 'token_quota_exhausted' END,
                    'counter', c_counter[j], 'limit', cap, 'committed', s_committed[k],
                    'liability', s_liability[k], 'reserved', s_reserved[k],
                    'leased', s_leased[k], 'amount', amount, 'window', c_window[j],
                    'dimension', c_dim[j]);
                EXIT;
            END IF;
        END LOOP;
        IF refusal IS NOT NULL THEN
            results[i] := refusal;
            CONTINUE;
        END IF;
        balances := '{}'::jsonb;
        FOR j IN r_first[i]..r_last[i] LOOP
            k := c_slot[j];
            IF c_kind[j] = 'bucket' THEN
                s_balance[k] := inferplane_refill_v1(s_balance[k], c_limit[j],
                                                     now_us - s_updated[k])
                                - c_amount[j] * 60000000;
                -- never move a bucket's clock backwards (refill would count twice)
                s_updated[k] := greatest(s_updated[k], now_us);
            ELSE
                s_reserved[k] := s_reserved[k] + c_amount[j];
                IF c_kind[j] = 'account' THEN
                    s_hard[k] := c_hard[j];
                END IF;
            END IF;
            s_limit[k] := c_limit[j];
            s_dirty[k] := true;
        END LOOP;
        FOR j IN r_first[i]..r_last[i] LOOP
            IF c_kind[j] = 'bucket' THEN
                balances := balances || jsonb_build_object(c_counter[j], s_balance[c_slot[j]]);
            END IF;
        END LOOP;
        pid := gen_random_uuid();
        granted := granted || i;
        pids := pids || pid;
        results[i] := jsonb_build_object('permit_id', pid, 'buckets', balances);
    END LOOP;

    -- 5. Write what changed: one statement per table.
    IF cardinality(granted) > 0 THEN
        UPDATE authority_accounts a
           SET reserved = u.reserved, "limit" = u.lim, hard = u.hard
          FROM unnest(s_key, s_acct, s_dirty, s_reserved, s_limit, s_hard)
               AS u(key, acct, dirty, reserved, lim, hard)
         WHERE u.dirty AND u.acct AND a.key = u.key;
        UPDATE counters c
           SET balance = u.balance, updated_us = u.updated_us, reserved = u.reserved,
               "limit" = u.lim
          FROM unnest(s_key, s_acct, s_dirty, s_balance, s_updated, s_reserved, s_limit)
               AS u(key, acct, dirty, balance, updated_us, reserved, lim)
         WHERE u.dirty AND NOT u.acct AND c.key = u.key;
        INSERT INTO permits (id, request_id, key_id, team_id, user_name, model, token_bound,
                             usd_bound, generation, day, month, admitted_us)
        SELECT g.pid, r.request_id, r.key_id, r.team_id, r.user_name, r.model,
               r.token_bound, r.usd_bound, r.policy_generation, r.day, r.month, now_us
          FROM unnest(granted, pids) AS g(i, pid)
          JOIN ROWS FROM (json_to_recordset(p_requests)
                          AS (request_id text, key_id text, team_id text, "user" text,
                              model text, token_bound bigint, usd_bound bigint,
                              policy_generation bigint, day text, month text))
               WITH ORDINALITY AS r(request_id, key_id, team_id, user_name, model,
                                    token_bound, usd_bound, policy_generation, day,
                                    month, o)
            ON r.o = g.i;
        INSERT INTO permit_segments (permit_id, counter, kind, dimension, amount, "limit",
                                     "window", rule_uid, hard)
        SELECT g.pid, x.counter, x.kind, x.dim, x.amount, x.lim, x.win, x.uid, x.hard
          FROM unnest(granted, pids) AS g(i, pid)
          JOIN unnest(c_req, c_counter, c_kind, c_dim, c_amount, c_limit, c_window, c_uid,
                      c_hard) AS x(req, counter, kind, dim, amount, lim, win, uid, hard)
            ON x.req = g.i;
    END IF;
    RETURN to_jsonb(results);
END
$$;
