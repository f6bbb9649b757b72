-- inferplane shared governance, version 7: a lone settlement that holds its counter rows
-- only for the counter arithmetic and the commit, and a lone admission with fewer
-- statements (issue 11).
--
-- Installed by migrations/versions/0008_lone_calls.py. Frozen once released, like every
-- _vN file. Same inputs, answers, arithmetic and lock orders as inferplane_settle_one_v5
-- and inferplane_admit_one_v5 (sql/plans_v5.sql), which stay installed and unchanged.
--
-- Why: a gateway answers before it settles (server.settle_wait_s 0), so a client's next
-- request is admitted while its previous request's settlement is in the database. On the
-- same team that admission waits for the counter rows the settlement locked, and v5 keeps
-- them locked while it writes the permit's segments and the permit row, then until its
-- commit. At concurrency 1 that wait is in every request's latency.
-- What:
--   * the permit's segments are read once, into arrays, in byte order: the commits are
--     checked against them (inferplane_check_parts_v2's two answers, the same first bad
--     counter) and they name the rows to lock (no subquery on permit_segments per lock
--     statement; no account statements for a permit that charged no account);
--   * the segments' parts and the permit row are written BEFORE the accounts and counters
--     are locked, as inferplane_settle_v6 does for a batch; the permit lock taken first
--     serialises every writer of those rows, so the global lock order is unchanged;
--   * the buckets and the windows charged are updated by one statement (a permit charges
--     a counter at most once: permit_segments' primary key).
--   tests/integration/test_pg_v3_equivalence.py runs it next to inferplane_settle_v2 and
--   compares answers and every row.

CREATE FUNCTION inferplane_settle_one_v7(p_permit uuid, p_settlement jsonb) RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    p permits;
    now_us bigint;
    v_kind text := p_settlement->>'kind';
    v_bad text;
    g_counter text[];
    g_kind text[];
    g_dim text[];
    v_accounts text[];
    v_counters text[];
    i int;
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

    -- 1. The segments, in byte order (under the permit's lock nothing changes them).
    SELECT coalesce(array_agg(g.counter), '{}'), coalesce(array_agg(g.kind), '{}'),
           coalesce(array_agg(g.dimension), '{}')
      INTO g_counter, g_kind, g_dim
      FROM (SELECT s.counter, s.kind, s.dimension FROM permit_segments s
             WHERE s.permit_id = p_permit ORDER BY s.counter COLLATE "C") g;

    -- 2. The commits checked (inferplane_check_parts_v2) and written with the permit.
    IF v_kind <> 'invalid' THEN
        FOR i IN 1..cardinality(g_counter) LOOP
            IF (p_settlement->'commits'->g_counter[i]) IS NULL THEN
                RETURN jsonb_build_object('bad_commits', g_counter[i],
                                          'problem', 'missing for a charged counter');
            END IF;
        END LOOP;
        SELECT ks.k INTO v_bad
          FROM (SELECT jsonb_object_keys(p_settlement->'commits') k
                UNION SELECT jsonb_object_keys(coalesce(p_settlement->'liabilities', '{}'))) ks
         WHERE ks.k <> ALL (g_counter)
         ORDER BY ks.k COLLATE "C" LIMIT 1;
        IF v_bad IS NOT NULL THEN
            RETURN jsonb_build_object('bad_commits', v_bad,
                                      'problem', 'this permit did not charge that counter');
        END IF;
        UPDATE permit_segments s
           SET committed = (p_settlement->'commits'->>s.counter)::bigint,
               liability = coalesce((p_settlement->'liabilities'->>s.counter)::bigint, 0)
         WHERE s.permit_id = p_permit;
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

    -- 3. The permit's rows in the global order: accounts, then counters, each by key.
    SELECT coalesce(array_agg(x.counter) FILTER (WHERE x.kind = 'account'), '{}'),
           coalesce(array_agg(x.counter) FILTER (WHERE x.kind <> 'account'), '{}')
      INTO v_accounts, v_counters
      FROM unnest(g_counter, g_kind) AS x(counter, kind);
    IF cardinality(v_accounts) > 0 THEN
        PERFORM 1 FROM authority_accounts WHERE key = ANY(v_accounts)
         ORDER BY key COLLATE "C" FOR UPDATE;
    END IF;
    PERFORM 1 FROM counters WHERE key = ANY(v_counters) ORDER BY key COLLATE "C" FOR UPDATE;
    now_us := inferplane_now_us_v1();

    -- 4. The counter arithmetic of inferplane_settle_one_v5.
    IF v_kind = 'invalid' THEN
        -- Change no counter; freeze every money window/account the permit charged.
        UPDATE counters SET frozen = true
         WHERE key IN (SELECT x.counter FROM unnest(g_counter, g_kind, g_dim)
                                             AS x(counter, kind, dim)
                        WHERE x.kind = 'window' AND x.dim = 'usd');
        IF cardinality(v_accounts) > 0 THEN
            UPDATE authority_accounts SET frozen = true WHERE key = ANY(v_accounts);
        END IF;
    ELSE
        -- Buckets trued up exactly as inferplane_settle_v2 (a credit reduced by the
        -- refill the reservation's lifetime could add; a debit into debt); windows
        -- released and committed.
        UPDATE counters c
           SET balance = CASE WHEN s.kind <> 'bucket' THEN c.balance ELSE
                   least(s."limit"::numeric * 60000000,
                         inferplane_refill_v1(c.balance, s."limit",
                                              now_us - c.updated_us)::numeric
                         + CASE WHEN s.amount > s.committed
                                THEN greatest(0, (s.amount - s.committed)::numeric
                                                 * 60000000
                                                 - s."limit"::numeric
                                                 * greatest(0, now_us - p.admitted_us))
                                ELSE (s.amount - s.committed)::numeric * 60000000
                           END)::bigint END,
               updated_us = CASE WHEN s.kind <> 'bucket' THEN c.updated_us
                                 ELSE greatest(c.updated_us, now_us) END,
               reserved = CASE WHEN s.kind <> 'window' THEN c.reserved
                               ELSE c.reserved - s.amount END,
               committed = CASE WHEN s.kind <> 'window' THEN c.committed
                                ELSE c.committed + s.committed END,
               liability = CASE WHEN s.kind <> 'window' THEN c.liability
                                ELSE c.liability + s.liability END
          FROM permit_segments s
         WHERE s.permit_id = p_permit AND s.kind IN ('bucket', 'window')
           AND c.key = s.counter;
        IF cardinality(v_accounts) > 0 THEN
            UPDATE authority_accounts a
               SET reserved = a.reserved - s.amount, committed = a.committed + s.committed,
                   liability = a.liability + s.liability
              FROM permit_segments s
             WHERE s.permit_id = p_permit AND s.kind = 'account' AND a.key = s.counter;
        END IF;
    END IF;
    -- inferplane_settle_result_v2's answer, built here (as v5 does).
    RETURN jsonb_build_object('permit_id', p.id, 'kind', p.status,
                              'tokens_committed', p.tokens_committed,
                              'usd_committed', p.usd_committed,
                              'tokens_liability', coalesce(p.tokens_liability, 0),
                              'usd_liability', coalesce(p.usd_liability, 0),
                              'bound_exceeded', p.bound_exceeded, 'replay', false);
END
$$;

-- inferplane_admit_one_v5 with two statements and a call fewer for a request that charges
-- no account (most: accounts are policy budgets' lease-aware rows): the account lock and
-- reservation run only when a charge is an account, and the permit and its segments are
-- inserted here instead of by inferplane_write_permit_v1 (the same two statements).
-- Everything else, the locks and their order included, is v5's text.
CREATE FUNCTION inferplane_admit_one_v7(p_requests jsonb) RETURNS jsonb
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
    pid uuid;
    -- Whether it charges an account (a policy budget): if not, no account statement runs.
    v_accounts boolean := jsonb_path_exists(req->'charges', '$[*] ? (@.kind == "account")');
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
        IF v_accounts THEN
            PERFORM 1 FROM authority_accounts
             WHERE key IN (SELECT x->>'counter' FROM jsonb_array_elements(req->'charges') x
                            WHERE x->>'kind' = 'account')
             ORDER BY key COLLATE "C" FOR UPDATE;
        END IF;
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
    IF v_accounts THEN
        UPDATE authority_accounts a
           SET reserved = a.reserved + x.amount, "limit" = x."limit",
               hard = coalesce(x.hard, true)
          FROM jsonb_to_recordset(req->'charges')
               AS x(counter text, kind text, amount bigint, "limit" bigint, hard boolean)
         WHERE x.kind = 'account' AND a.key = x.counter;
    END IF;
    -- The permit and its segments (inferplane_write_permit_v1's two statements, inline).
    pid := gen_random_uuid();
    INSERT INTO permits (id, request_id, key_id, team_id, user_name, model, token_bound,
                         usd_bound, generation, day, month, admitted_us)
    VALUES (pid, req->>'request_id', req->>'key_id', req->>'team_id', req->>'user',
            req->>'model', (req->>'token_bound')::bigint, (req->>'usd_bound')::bigint,
            (req->>'policy_generation')::bigint, req->>'day', req->>'month', now_us);
    INSERT INTO permit_segments (permit_id, counter, kind, dimension, amount, "limit",
                                 "window", rule_uid, hard)
    SELECT pid, e->>'counter', e->>'kind', e->>'dimension', (e->>'amount')::bigint,
           (e->>'limit')::bigint, e->>'window', e->>'rule_uid',
           coalesce((e->>'hard')::boolean, true)
      FROM jsonb_array_elements(req->'charges') e;
    RETURN jsonb_build_array(jsonb_build_object('permit_id', pid, 'buckets', balances));
END
$$;
