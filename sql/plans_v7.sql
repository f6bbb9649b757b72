-- inferplane shared governance, version 7: a lone settlement that holds its counter rows
-- only for the counter arithmetic and the commit (issue 11).
--
-- Installed by migrations/versions/0008_lone_settle.py. Frozen once released, like every
-- _vN file. Same inputs, answers, arithmetic and lock order (permits, accounts, counters)
-- as inferplane_settle_one_v5 (sql/plans_v5.sql), which stays installed and unchanged.
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
