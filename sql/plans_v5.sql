-- inferplane shared governance, version 5: the hot calls planned once per session, and a
-- lone settlement in fewer statements (issue 11).
--
-- Installed by migrations/versions/0006_generic_plans.py. Frozen once released, like
-- every _vN file. Same inputs, answers, arithmetic and lock order as the v4 calls
-- (sql/plans_v4.sql), which stay installed and unchanged.
--
-- Why. With plan_cache_mode = auto (the server default) a cached statement is planned
-- anew on every call for as long as its generic plan looks dearer than the custom ones
-- made so far, and a custom plan sees the parameters: an array unnest()'s exact length,
-- an empty ANY('{}') that folds to false. So the statements that write a batch from its
-- arrays (UPDATE counters / permits ... FROM unnest(...)) and the count of a batch's
-- missing rows were planned on every call, forever: measured with pg_stat_statements
-- (track = all, track_planning) on batches of 4, four statements re-planned per admit +
-- settle, their planning costing more than their execution. Two helper functions of the
-- lone settlement are LANGUAGE sql (inferplane_record_v2, inferplane_settle_result_v2),
-- and a non-inlined SQL function's statements are parsed and planned on every call.
--
-- What.
--   * Every function below runs with plan_cache_mode = force_generic_plan, as well as
--     enable_seqscan and jit off (v4's reasons: sql/plans_v4.sql), for the call only
--     (a function's SET clause: restored when it returns). A generic plan is made once
--     per session and statement and cannot use a sequential scan, so it stays an index
--     plan: tests/integration/test_pg_plans.py checks it on tables grown after the plans
--     were cached.
--   * inferplane_admit_one_v5 is inferplane_admit_v2 for one request in a dozen
--     statements instead of about thirty: the snapshot checked inline; the rows locked
--     as v2 locks them (a missing row on v1's row-by-row path); the charges checked in
--     order by one join, with inferplane_check_charge_v2's arithmetic and figures; the
--     counters and accounts reserved by one UPDATE each (inferplane_reserve_charge_v1's
--     arithmetic, the buckets' balances returned by it); the permit and its segments
--     written by inferplane_write_permit_v1. Any other input (a batch, a counter charged twice) goes to v2 itself.
--   * inferplane_settle_one_v5 is inferplane_settle_v2 with its per-segment loop made
--     set-based and its SQL helpers written inline: the permit locked; the answer for an
--     unknown, replayed, conflicting or mismatched settlement as v2 gives it; the
--     permit's accounts, then its counters, locked by one sorted statement each (every
--     "account:" key sorts before every counter key: v2's byte order over all of them);
--     the segments, buckets, windows and accounts written by one UPDATE each with v2's
--     arithmetic; the permit recorded.
--   tests/integration/test_pg_v3_equivalence.py runs both next to v2 (admit_one_v5 on
--   the requests of an admission batch one by one, against v2 on the batch;
--   settle_one_v5 on every settlement batch item by item, against v2 item by item) and
--   compares answers and every row.
-- Measured (tests/bench/versions.py: v4 and v5 on their own connections, interleaved on
-- one database; Postgres CPU per admit + settle pair of one team charging four counters;
-- docs/hot-team.md step 7): 26 per cent less alone, 16 per cent less in batches of 4 and
-- 6 per cent less in batches of 16 than v4.

CREATE FUNCTION inferplane_admit_v5(p_requests json) RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN inferplane_admit_v3(p_requests);
END
$$;

CREATE FUNCTION inferplane_admit_one_v5(p_requests jsonb) RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    req jsonb := p_requests->0;
    k keys;
    team_rev bigint;
    cur_gen bigint;
    now_us bigint;
    n_missing int;
    n_repeated int;
    ch record;
    chj jsonb;
    bal bigint;
    refusal jsonb;
    balances jsonb;
BEGIN
    IF jsonb_array_length(p_requests) <> 1 THEN  -- the store sends one; any other, v2
        RETURN inferplane_admit_v2(p_requests);
    END IF;
    -- 1. Definitions, in the fixed order (keys, teams, policy generation), and the
    --    snapshot checked with inferplane_check_snapshot_v1's conditions.
    SELECT * INTO k FROM keys WHERE id = req->>'key_id' FOR SHARE;
    SELECT revision INTO team_rev FROM teams WHERE id = req->>'team_id' FOR SHARE;
    SELECT ps.generation INTO cur_gen FROM policy_state ps FOR SHARE;
    IF k.id IS NULL OR k.revoked_at IS NOT NULL
       OR (k.expires_at IS NOT NULL AND k.expires_at <= clock_timestamp())
       OR k.revision <> (req->>'key_revision')::bigint
       OR k.team_id <> req->>'team_id' THEN
        RETURN jsonb_build_array(jsonb_build_object(
            'status', 503, 'reason', 'snapshot_mismatch', 'counter', 'key:' || (req->>'key_id')));
    END IF;
    IF team_rev IS DISTINCT FROM (req->>'team_revision')::bigint THEN
        RETURN jsonb_build_array(jsonb_build_object(
            'status', 503, 'reason', 'snapshot_mismatch', 'counter', 'team:' || (req->>'team_id')));
    END IF;
    IF cur_gen <> (req->>'policy_generation')::bigint THEN
        RETURN jsonb_build_array(jsonb_build_object(
            'status', 503, 'reason', 'snapshot_mismatch', 'counter', 'policy'));
    END IF;

    -- 2. The rows it charges, locked in the global order: if one is missing (a new
    --    window, team or key), v1's row-by-row path in byte order (lock, else insert and
    --    lock), as v2 does; else the accounts, then the counters, each by one sorted
    --    statement (every "account:" key sorts before every counter key).
    SELECT count(*) FILTER (WHERE NOT EXISTS (
                SELECT 1 FROM authority_accounts a WHERE x.kind = 'account' AND a.key = x.counter
                UNION ALL
                SELECT 1 FROM counters c WHERE x.kind <> 'account' AND c.key = x.counter)),
           count(*) - count(DISTINCT x.counter)
      INTO n_missing, n_repeated
      FROM jsonb_to_recordset(req->'charges') AS x(counter text, kind text);
    IF n_repeated > 0 THEN  -- a counter charged twice: v2 reserves it charge by charge
        RETURN inferplane_admit_v2(p_requests);
    END IF;
    now_us := inferplane_now_us_v1();
    IF n_missing > 0 THEN
        FOR chj IN SELECT x FROM jsonb_array_elements(req->'charges') x
                    ORDER BY x->>'counter' COLLATE "C" LOOP
            PERFORM inferplane_lock_charge_v1(chj, now_us);
        END LOOP;
    ELSE
        PERFORM 1 FROM authority_accounts
         WHERE key IN (SELECT x->>'counter' FROM jsonb_array_elements(req->'charges') x
                        WHERE x->>'kind' = 'account')
         ORDER BY key COLLATE "C" FOR UPDATE;
        PERFORM 1 FROM counters
         WHERE key IN (SELECT x->>'counter' FROM jsonb_array_elements(req->'charges') x
                        WHERE x->>'kind' <> 'account')
         ORDER BY key COLLATE "C" FOR UPDATE;
    END IF;
    now_us := inferplane_now_us_v1();

    -- 3. Each charge checked in order (inferplane_check_charge_v2), all or none.
    FOR ch IN
        SELECT x.counter, x.kind, x.dimension, x.amount, x."limit" AS cap,
               coalesce(x.hard, true) AS hard, x."window",
               c.balance, c.updated_us,
               coalesce(c.committed, a.committed) AS committed,
               coalesce(c.reserved, a.reserved) AS reserved,
               coalesce(c.liability, a.liability) AS liability,
               coalesce(c.frozen, a.frozen) AS frozen,
               coalesce(a.leased_outstanding, 0) AS leased
          FROM ROWS FROM (jsonb_to_recordset(req->'charges')
                          AS (counter text, kind text, dimension text, amount bigint,
                              "limit" bigint, hard boolean, "window" text))
               WITH ORDINALITY AS x(counter, kind, dimension, amount, "limit", hard,
                                    "window", o)
          LEFT JOIN counters c ON x.kind <> 'account' AND c.key = x.counter
          LEFT JOIN authority_accounts a ON x.kind = 'account' AND a.key = x.counter
         ORDER BY x.o
    LOOP
        IF ch.kind = 'bucket' THEN
            bal := inferplane_refill_v1(ch.balance, ch.cap, now_us - ch.updated_us);
            IF bal < least(ch.amount, ch.cap)::numeric * 60000000 THEN
                refusal := jsonb_build_object(
                    'status', CASE WHEN ch.dimension = 'usd' THEN 402 ELSE 429 END,
                    'reason', 'rate_limited', 'counter', ch.counter,
                    'retry_after', inferplane_retry_after_v1(bal, ch.cap, ch.amount),
                    'limit', ch.cap, 'amount', ch.amount, 'dimension', ch.dimension);
            END IF;
        ELSIF ch.frozen THEN
            refusal := jsonb_build_object('status', 402, 'reason', 'account_frozen',
                                          'counter', ch.counter);
        ELSIF ch.hard AND ch.cap IS NOT NULL
              AND ch.committed + ch.liability + ch.reserved + ch.leased + ch.amount > ch.cap THEN
            refusal := jsonb_build_object(
                'status', CASE WHEN ch.dimension = 'usd' THEN 402 ELSE 429 END,
                'reason', CASE WHEN ch.dimension = 'usd' THEN 'budget_exhausted'
                               ELSE 'token_quota_exhausted' END,
                'counter', ch.counter, 'limit', ch.cap, 'committed', ch.committed,
                'liability', ch.liability, 'reserved', ch.reserved, 'leased', ch.leased,
                'amount', ch.amount, 'window', ch."window", 'dimension', ch.dimension);
        END IF;
        IF refusal IS NOT NULL THEN
            RETURN jsonb_build_array(refusal);
        END IF;
    END LOOP;

    -- 4. Reserved (inferplane_reserve_charge_v1), and the permit written.
    WITH u AS (
        UPDATE counters c
           SET balance = CASE WHEN x.kind = 'bucket'
                              THEN inferplane_refill_v1(c.balance, x."limit",
                                                        now_us - c.updated_us)
                                   - x.amount * 60000000
                              ELSE c.balance END,
               updated_us = CASE WHEN x.kind = 'bucket' THEN greatest(c.updated_us, now_us)
                                 ELSE c.updated_us END,
               reserved = CASE WHEN x.kind = 'bucket' THEN c.reserved
                               ELSE c.reserved + x.amount END,
               "limit" = x."limit"
          FROM jsonb_to_recordset(req->'charges')
               AS x(counter text, kind text, amount bigint, "limit" bigint)
         WHERE x.kind <> 'account' AND c.key = x.counter
        RETURNING c.key, c.balance, c.kind = 'bucket' AND x.kind = 'bucket' AS bucket)
    -- Each charged bucket's balance right after its reservation (inferplane_admit_v2).
    SELECT coalesce(jsonb_object_agg(u.key, u.balance) FILTER (WHERE u.bucket), '{}'::jsonb)
      INTO balances FROM u;
    UPDATE authority_accounts a
       SET reserved = a.reserved + x.amount, "limit" = x."limit",
           hard = coalesce(x.hard, true)
      FROM jsonb_to_recordset(req->'charges')
           AS x(counter text, kind text, amount bigint, "limit" bigint, hard boolean)
     WHERE x.kind = 'account' AND a.key = x.counter;
    RETURN jsonb_build_array(jsonb_build_object(
        'permit_id', inferplane_write_permit_v1(req, now_us), 'buckets', balances));
END
$$;

CREATE FUNCTION inferplane_settle_v5(p_items jsonb) RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN inferplane_settle_v3(p_items);
END
$$;

CREATE FUNCTION inferplane_settle_one_v5(p_permit uuid, p_settlement jsonb) RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    p permits;
    now_us bigint;
    v_kind text := p_settlement->>'kind';
    v_bad jsonb;
BEGIN
    SELECT * INTO p FROM permits WHERE id = p_permit FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('unknown', true);
    END IF;
    IF p.status <> 'pending' THEN
        IF p.settle_fingerprint = p_settlement->>'fingerprint' THEN
            RETURN inferplane_settle_result_v2(p, true);  -- a replay: rare, planned per call
        END IF;
        RETURN jsonb_build_object('conflict', true, 'kind', p.status);
    END IF;
    IF v_kind <> 'invalid' THEN
        v_bad := inferplane_check_parts_v2(p_permit, p_settlement);
        IF v_bad IS NOT NULL THEN
            RETURN v_bad;
        END IF;
    END IF;

    -- The permit's rows in the global order: accounts, then counters, each by key.
    PERFORM 1 FROM authority_accounts
     WHERE key IN (SELECT counter FROM permit_segments
                    WHERE permit_id = p_permit AND kind = 'account')
     ORDER BY key COLLATE "C" FOR UPDATE;
    PERFORM 1 FROM counters
     WHERE key IN (SELECT counter FROM permit_segments
                    WHERE permit_id = p_permit AND kind <> 'account')
     ORDER BY key COLLATE "C" FOR UPDATE;
    now_us := inferplane_now_us_v1();

    IF v_kind = 'invalid' THEN
        -- Change no counter; freeze every money window/account the permit charged.
        UPDATE counters SET frozen = true
         WHERE key IN (SELECT counter FROM permit_segments
                        WHERE permit_id = p_permit AND kind = 'window' AND dimension = 'usd');
        UPDATE authority_accounts SET frozen = true
         WHERE key IN (SELECT counter FROM permit_segments
                        WHERE permit_id = p_permit AND kind = 'account');
    ELSE
        -- Each segment's part first; the counters then read it from the segment.
        UPDATE permit_segments s
           SET committed = (p_settlement->'commits'->>s.counter)::bigint,
               liability = coalesce((p_settlement->'liabilities'->>s.counter)::bigint, 0)
         WHERE s.permit_id = p_permit;
        -- Buckets trued up exactly as inferplane_settle_v2 (a credit reduced by the
        -- refill the reservation's lifetime could add; a debit into debt).
        UPDATE counters c
           SET balance = least(s."limit"::numeric * 60000000,
                               inferplane_refill_v1(c.balance, s."limit",
                                                    now_us - c.updated_us)::numeric
                               + CASE WHEN s.amount > s.committed
                                      THEN greatest(0, (s.amount - s.committed)::numeric
                                                       * 60000000
                                                       - s."limit"::numeric
                                                       * greatest(0, now_us - p.admitted_us))
                                      ELSE (s.amount - s.committed)::numeric * 60000000
                                 END)::bigint,
               updated_us = greatest(c.updated_us, now_us)
          FROM permit_segments s
         WHERE s.permit_id = p_permit AND s.kind = 'bucket' AND c.key = s.counter;
        UPDATE counters c
           SET reserved = c.reserved - s.amount, committed = c.committed + s.committed,
               liability = c.liability + s.liability
          FROM permit_segments s
         WHERE s.permit_id = p_permit AND s.kind = 'window' AND c.key = s.counter;
        UPDATE authority_accounts a
           SET reserved = a.reserved - s.amount, committed = a.committed + s.committed,
               liability = a.liability + s.liability
          FROM permit_segments s
         WHERE s.permit_id = p_permit AND s.kind = 'account' AND a.key = s.counter;
    END IF;

    UPDATE permits
       SET status = v_kind, settle_fingerprint = p_settlement->>'fingerprint',
           detail = p_settlement->>'detail',
           tokens_committed = (p_settlement->>'tokens_committed')::bigint,
           usd_committed = (p_settlement->>'usd_committed')::bigint,
           tokens_liability = (p_settlement->>'tokens_liability')::bigint,
           usd_liability = (p_settlement->>'usd_liability')::bigint,
           bound_exceeded = coalesce((p_settlement->>'bound_exceeded')::boolean, false),
           settled_at = clock_timestamp()
     WHERE id = p_permit
    RETURNING * INTO p;
    -- inferplane_settle_result_v2's answer, built here: that SQL function is planned on
    -- every call.
    RETURN jsonb_build_object('permit_id', p.id, 'kind', p.status,
                              'tokens_committed', p.tokens_committed,
                              'usd_committed', p.usd_committed,
                              'tokens_liability', coalesce(p.tokens_liability, 0),
                              'usd_liability', coalesce(p.usd_liability, 0),
                              'bound_exceeded', p.bound_exceeded, 'replay', false);
END
$$;

CREATE FUNCTION inferplane_resolve_v5(p_permit uuid, p_settlement jsonb) RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN inferplane_resolve_v2(p_permit, p_settlement);
END
$$;

CREATE FUNCTION inferplane_settle_admit_v5(p_items jsonb, p_requests json) RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN inferplane_settle_admit_v3(p_items, p_requests);
END
$$;
