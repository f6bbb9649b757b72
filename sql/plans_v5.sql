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
--   * inferplane_settle_one_v5 is inferplane_settle_v2 with its per-segment loop made
--     set-based and its SQL helpers written inline: the permit locked; the answer for an
--     unknown, replayed, conflicting or mismatched settlement as v2 gives it; the
--     permit's accounts, then its counters, locked by one sorted statement each (every
--     "account:" key sorts before every counter key: v2's byte order over all of them);
--     the segments, buckets, windows and accounts written by one UPDATE each with v2's
--     arithmetic; the permit recorded. tests/integration/test_pg_v3_equivalence.py runs
--     it next to v2 on every settlement batch and compares answers and rows.
-- Measured (one connection each, interleaved, admit + settle pairs of one team charging
-- four counters; tests/bench/batchcost.py and docs/hot-team.md): Postgres CPU per pair
-- 14 per cent less in batches of 4, 6 per cent less in batches of 16 than v4, and
-- a lone pair 19 per cent less.

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
BEGIN
    RETURN inferplane_admit_v2(p_requests);
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
            RETURN jsonb_build_object('permit_id', p.id, 'kind', p.status,
                                      'tokens_committed', p.tokens_committed,
                                      'usd_committed', p.usd_committed,
                                      'tokens_liability', coalesce(p.tokens_liability, 0),
                                      'usd_liability', coalesce(p.usd_liability, 0),
                                      'bound_exceeded', p.bound_exceeded, 'replay', true);
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
