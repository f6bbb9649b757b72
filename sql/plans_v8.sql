-- inferplane shared governance, version 8: a batch admission that writes its permits
-- before it locks its counters, and batch calls without an empty accounts UPDATE
-- (issue 11).
--
-- Installed by migrations/versions/0009_permits_first.py. Frozen once released, like every
-- _vN file. Same inputs, answers, arithmetic and lock order as inferplane_admit_v6 and
-- inferplane_settle_v6 (sql/plans_v6.sql), which stay installed and unchanged, as do the
-- lone and merged calls.
--
-- Why: one hot team's admissions and settlements wait on the same counter rows, each
-- holding them from its lock statement to its commit (docs/hot-team.md). In
-- inferplane_admit_checked_v6 the permits and their segments (one row per charge, each
-- with its foreign-key check) are inserted after the counters are locked: by
-- pg_stat_statements, about a third of a hot batch's time (tests/bench/statements.py),
-- all of it inside the hold. inferplane_settle_one_v7 already writes its permit first.
-- What, in inferplane_admit_checked_v8 (v6's body otherwise):
--   * every snapshot-current request gets its permit id and its permit and segment rows
--     right after the snapshot check, before any account or counter is locked. They are
--     new rows that no other transaction can see or lock, so this adds no lock-order
--     edge; a request the decisions then refuse has its segments and permit deleted in
--     the same transaction, so the committed rows are v6's;
--   * the permit's admitted_us is database time read there, before the counter locks,
--     instead of after them. It is only read by a settlement's TPM true-up, which reduces
--     a credit by the refill since admitted_us: an earlier instant credits less, never
--     more (the bucket errs low by at most the lock wait's refill);
--   * the accounts' UPDATE runs only when the batch charged an account;
--   * fewer PL/pgSQL steps per charge: a granted request's bucket balances are collected
--     as its charges are reserved (v6 walked its charges a third time for them), and a
--     refusal's money flag is computed only when there is a refusal.
-- And in inferplane_settle_v8 (v6's body otherwise): the accounts' UPDATE, inside the
-- counter locks, runs only when an account was locked (most teams charge none: no
-- policy budget); and the segments' UPDATE takes each segment's parts from its
-- settlement's commits and liabilities by a join on the permit, instead of four array
-- appends per segment in the decision loop (one per settlement now).
-- Runs with v6's settings for the call (enable_seqscan and jit off, generic plans, no
-- parallel workers). tests/integration/test_pg_v3_equivalence.py runs both next to v2
-- and compares answers and every row.

CREATE FUNCTION inferplane_admit_checked_v8(p_requests jsonb, p_snapshot jsonb[])
RETURNS jsonb
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
    granted int := 0;
    cand int[] := '{}';
    pid_of uuid[];
    refused uuid[] := '{}';
    accounts_dirty boolean := false;
    admitted_us bigint;
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
    ch jsonb;
BEGIN
    -- 1. Parse once, sorted once (the aggregates read the sorted rows in order).
    n := jsonb_array_length(p_requests);
    IF n = 0 THEN
        RETURN '[]'::jsonb;
    END IF;
    SELECT array_agg(x.req), array_agg(x.counter), array_agg(x.kind), array_agg(x.dimension),
           array_agg(x.amount), array_agg(x.lim), array_agg(x.win), array_agg(x.rule_uid),
           array_agg(x.hard)
      INTO c_req, c_counter, c_kind, c_dim, c_amount, c_limit, c_window, c_uid, c_hard
      FROM (SELECT e.o::int AS req, c.counter, c.kind, c.dimension, c.amount, c.lim, c.win,
                   c.rule_uid, coalesce(c.hard, true) AS hard
              FROM jsonb_array_elements(p_requests) WITH ORDINALITY AS e(doc, o),
                   ROWS FROM (jsonb_to_recordset(e.doc->'charges')
                              AS (counter text, kind text, dimension text, amount bigint,
                                  "limit" bigint, "window" text, rule_uid text, hard boolean))
                   WITH ORDINALITY AS c(counter, kind, dimension, amount, lim, win,
                                        rule_uid, hard, o)
             ORDER BY e.o, c.o) x;
    c_req := coalesce(c_req, '{}');
    r_first := array_fill(1, ARRAY[n]);
    r_last := array_fill(0, ARRAY[n]);
    FOR j IN 1..coalesce(array_length(c_req, 1), 0) LOOP
        IF r_last[c_req[j]] = 0 THEN
            r_first[c_req[j]] := j;
        END IF;
        r_last[c_req[j]] := j;
    END LOOP;

    -- 2. Definitions locked and every snapshot checked (by the caller).
    results := p_snapshot;

    -- 3. The permit and segments of every snapshot-current request, written BEFORE any
    --    account or counter is locked (new rows nobody else can see: no lock order),
    --    so a hot team's rows are held for the decisions, the counter writes and the
    --    commit only. A request the decisions below refuse has its rows deleted again
    --    in this transaction. admitted_us is database time read here, before the
    --    counter locks: a settlement's TPM credit is reduced by the refill since then
    --    (inferplane_settle_v2), so an earlier instant only ever credits less.
    pid_of := array_fill(NULL::uuid, ARRAY[n]);
    FOR i IN 1..n LOOP
        IF results[i] IS NULL THEN
            cand := cand || i;
            pid_of[i] := gen_random_uuid();
        END IF;
    END LOOP;
    IF cardinality(cand) = 0 THEN
        RETURN to_jsonb(results);
    END IF;
    admitted_us := inferplane_now_us_v1();
    INSERT INTO permits (id, request_id, key_id, team_id, user_name, model, token_bound,
                         usd_bound, generation, day, month, admitted_us)
    SELECT pid_of[r.o], r.request_id, r.key_id, r.team_id, r.user_name, r.model,
           r.token_bound, r.usd_bound, r.policy_generation, r.day, r.month, admitted_us
      FROM ROWS FROM (jsonb_to_recordset(p_requests)
                      AS (request_id text, key_id text, team_id text, "user" text,
                          model text, token_bound bigint, usd_bound bigint,
                          policy_generation bigint, day text, month text))
           WITH ORDINALITY AS r(request_id, key_id, team_id, user_name, model,
                                token_bound, usd_bound, policy_generation, day, month, o)
     WHERE pid_of[r.o] IS NOT NULL;
    INSERT INTO permit_segments (permit_id, counter, kind, dimension, amount, "limit",
                                 "window", rule_uid, hard)
    SELECT pid_of[x.req], x.counter, x.kind, x.dim, x.amount, x.lim, x.win, x.uid, x.hard
      FROM unnest(c_req, c_counter, c_kind, c_dim, c_amount, c_limit, c_window, c_uid,
                  c_hard) AS x(req, counter, kind, dim, amount, lim, win, uid, hard)
     WHERE pid_of[x.req] IS NOT NULL;

    -- 4. The rows the still-admissible requests charge, in one sorted pass.
    SELECT coalesce(array_agg(d.counter) FILTER (WHERE d.acct), '{}'),
           coalesce(array_agg(d.counter) FILTER (WHERE NOT d.acct), '{}')
      INTO a_keys, k_keys
      FROM (SELECT DISTINCT x.counter, x.kind = 'account' AS acct
              FROM unnest(c_req, c_counter, c_kind) AS x(req, counter, kind)
             WHERE results[x.req] IS NULL) d;
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
    SELECT coalesce(array_agg(r.key), '{}'), coalesce(array_agg(r.acct), '{}'),
           coalesce(array_agg(r.balance), '{}'), coalesce(array_agg(r.updated_us), '{}'),
           coalesce(array_agg(r.reserved), '{}'), coalesce(array_agg(r.committed), '{}'),
           coalesce(array_agg(r.liability), '{}'), coalesce(array_agg(r.leased), '{}'),
           coalesce(array_agg(r.frozen), '{}'), coalesce(array_agg(r.lim), '{}'),
           coalesce(array_agg(r.hard), '{}')
      INTO s_key, s_acct, s_balance, s_updated, s_reserved, s_committed, s_liability,
           s_leased, s_frozen, s_limit, s_hard
      FROM (SELECT * FROM (SELECT a.key, true AS acct, NULL::bigint AS balance,
                                  NULL::bigint AS updated_us, a.reserved, a.committed,
                                  a.liability, a.leased_outstanding AS leased, a.frozen,
                                  a."limit" AS lim, a.hard
                             FROM authority_accounts a WHERE a.key = ANY(a_keys || k_keys)
                            ORDER BY a.key COLLATE "C" FOR UPDATE) accounts
            UNION ALL
            SELECT * FROM (SELECT c.key, false, c.balance, c.updated_us, c.reserved,
                                  c.committed, c.liability, 0::bigint, c.frozen, c."limit",
                                  true
                             FROM counters c WHERE c.key = ANY(a_keys || k_keys)
                            ORDER BY c.key COLLATE "C" FOR UPDATE) counters) r;
    SELECT coalesce(array_agg(array_position(s_key, x.k) ORDER BY x.o), '{}') INTO c_slot
      FROM unnest(c_counter) WITH ORDINALITY AS x(k, o);
    s_dirty := array_fill(false, ARRAY[cardinality(s_key)]);
    -- Database time read with every lock held (see inferplane_admit_v1).
    now_us := inferplane_now_us_v1();

    -- 5. Each request all-or-none, in order, on the running state.
    FOR i IN 1..n LOOP
        CONTINUE WHEN results[i] IS NOT NULL;
        refusal := NULL;
        FOR j IN r_first[i]..r_last[i] LOOP
            k := c_slot[j];
            amount := c_amount[j];
            cap := c_limit[j];
            IF c_kind[j] = 'bucket' THEN
                bal := inferplane_refill_v1(s_balance[k], cap, now_us - s_updated[k]);
                IF bal < least(amount, cap)::numeric * 60000000 THEN
                    money := c_dim[j] = 'usd';
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
                money := c_dim[j] = 'usd';
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
            refused := refused || pid_of[i];
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
                -- A bucket charged twice by one request: the later entry overwrites.
                balances := balances || jsonb_build_object(c_counter[j], s_balance[k]);
            ELSE
                s_reserved[k] := s_reserved[k] + c_amount[j];
                IF c_kind[j] = 'account' THEN
                    s_hard[k] := c_hard[j];
                    accounts_dirty := true;
                END IF;
            END IF;
            s_limit[k] := c_limit[j];
            s_dirty[k] := true;
        END LOOP;
        granted := granted + 1;
        results[i] := jsonb_build_object('permit_id', pid_of[i], 'buckets', balances);
    END LOOP;

    -- 6. Write what changed: one statement per table (the accounts' only when an
    --    account was charged); the refused requests' permits and segments deleted.
    IF cardinality(refused) > 0 THEN
        DELETE FROM permit_segments WHERE permit_id = ANY(refused);
        DELETE FROM permits WHERE id = ANY(refused);
    END IF;
    IF granted > 0 THEN
        IF accounts_dirty THEN
            UPDATE authority_accounts a
               SET reserved = u.reserved, "limit" = u.lim, hard = u.hard
              FROM unnest(s_key, s_acct, s_dirty, s_reserved, s_limit, s_hard)
                   AS u(key, acct, dirty, reserved, lim, hard)
             WHERE u.dirty AND u.acct AND a.key = u.key;
        END IF;
        UPDATE counters c
           SET balance = u.balance, updated_us = u.updated_us, reserved = u.reserved,
               "limit" = u.lim
          FROM unnest(s_key, s_acct, s_dirty, s_balance, s_updated, s_reserved, s_limit)
               AS u(key, acct, dirty, balance, updated_us, reserved, lim)
         WHERE u.dirty AND NOT u.acct AND c.key = u.key;
    END IF;
    RETURN to_jsonb(results);
END
$$;

CREATE FUNCTION inferplane_admit_v8(p_requests jsonb) RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan
SET max_parallel_workers_per_gather = 0 AS $$
BEGIN
    IF jsonb_array_length(p_requests) = 0 THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN inferplane_admit_checked_v8(p_requests, inferplane_snapshot_v6(p_requests));
END
$$;

-- inferplane_settle_v6 with the accounts' UPDATE only when an account was locked, and the
-- segments' parts joined in their UPDATE.
CREATE FUNCTION inferplane_settle_v8(p_items jsonb) RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan
SET max_parallel_workers_per_gather = 0 AS $$
DECLARE
    n int;
    -- The settlements, in batch order.
    i_permit uuid[];
    i_kind text[];
    i_fp text[];
    i_detail text[];
    i_tc bigint[];
    i_uc bigint[];
    i_tl bigint[];
    i_ul bigint[];
    i_be boolean[];
    i_commits jsonb[];
    i_liabs jsonb[];
    i_nkeys int[];
    -- The permits, sorted by id as locked; their state as the batch runs.
    p_id uuid[];
    p_status text[];
    p_fp text[];
    p_detail text[];
    p_admitted bigint[];
    p_tc bigint[];
    p_uc bigint[];
    p_tl bigint[];
    p_ul bigint[];
    p_be boolean[];
    p_dirty boolean[];
    p_first int[];
    p_last int[];
    -- The pending permits' segments, sorted by permit id then counter.
    g_permit uuid[];
    g_counter text[];
    g_kind text[];
    g_dim text[];
    g_amount bigint[];
    g_limit bigint[];
    g_slot int[];
    -- The locked accounts then counters, and their running figures.
    s_key text[];
    s_acct boolean[];
    s_balance bigint[];
    s_updated bigint[];
    s_reserved bigint[];
    s_committed bigint[];
    s_liability bigint[];
    s_frozen boolean[];
    s_leased bigint[];
    s_limit bigint[];
    s_hard boolean[];
    s_dirty boolean[];
    -- The segment updates.
    u_permit uuid[] := '{}';
    u_commits jsonb[] := '{}';
    u_liabs jsonb[] := '{}';
    results jsonb[];
    now_us bigint;
    t int;
    q int;
    s int;
    k int;
    v_commit bigint;
    v_liability bigint;
    v_delta numeric;
    v_bad text;
    v_rows text[];
    m int;
    -- The settlements that change their permit, and their permits' slots.
    applied int[] := '{}';
    applied_to int[] := '{}';
BEGIN
    -- 1. Parse once (the aggregates read the elements in order).
    SELECT count(*), array_agg(e.permit_id), array_agg(e.kind), array_agg(e.fp),
           array_agg(e.detail), array_agg(e.tc), array_agg(e.uc), array_agg(e.tl),
           array_agg(e.ul), array_agg(e.be), array_agg(e.commits), array_agg(e.liabs),
           array_agg(e.nkeys)
      INTO n, i_permit, i_kind, i_fp, i_detail, i_tc, i_uc, i_tl, i_ul, i_be, i_commits,
           i_liabs, i_nkeys
      FROM (SELECT (e.d->>'permit_id')::uuid AS permit_id, e.d->>'kind' AS kind,
                   e.d->>'fingerprint' AS fp, e.d->>'detail' AS detail,
                   (e.d->>'tokens_committed')::bigint AS tc,
                   (e.d->>'usd_committed')::bigint AS uc,
                   (e.d->>'tokens_liability')::bigint AS tl,
                   (e.d->>'usd_liability')::bigint AS ul,
                   coalesce((e.d->>'bound_exceeded')::boolean, false) AS be,
                   coalesce(e.d->'commits', '{}') AS commits,
                   coalesce(e.d->'liabilities', '{}') AS liabs,
                   (SELECT count(*) FROM (
                        SELECT jsonb_object_keys(coalesce(e.d->'commits', '{}'))
                        UNION SELECT jsonb_object_keys(coalesce(e.d->'liabilities', '{}'))
                    ) ks)::int AS nkeys
              FROM jsonb_array_elements(p_items) WITH ORDINALITY AS e(d, o)
             ORDER BY e.o) e;
    IF n = 0 THEN
        RETURN '[]'::jsonb;
    END IF;
    results := array_fill(NULL::jsonb, ARRAY[n]);

    -- 2. The permits, locked in id order, and the pending ones' segments.
    SELECT coalesce(array_agg(p.id), '{}'), array_agg(p.status),
           array_agg(p.settle_fingerprint), array_agg(p.detail), array_agg(p.admitted_us),
           array_agg(p.tokens_committed), array_agg(p.usd_committed),
           array_agg(p.tokens_liability), array_agg(p.usd_liability),
           array_agg(p.bound_exceeded)
      INTO p_id, p_status, p_fp, p_detail, p_admitted, p_tc, p_uc, p_tl, p_ul, p_be
      FROM (SELECT * FROM permits WHERE id = ANY(i_permit) ORDER BY id FOR UPDATE) p;
    p_dirty := array_fill(false, ARRAY[cardinality(p_id)]);
    p_first := array_fill(1, ARRAY[cardinality(p_id)]);
    p_last := array_fill(0, ARRAY[cardinality(p_id)]);
    SELECT coalesce(array_agg(ps.permit_id), '{}'), array_agg(ps.counter),
           array_agg(ps.kind), array_agg(ps.dimension), array_agg(ps.amount),
           array_agg(ps."limit")
      INTO g_permit, g_counter, g_kind, g_dim, g_amount, g_limit
      FROM (SELECT s.permit_id, s.counter, s.kind, s.dimension, s.amount, s."limit"
              FROM permit_segments s
             WHERE s.permit_id IN (SELECT x.id FROM unnest(p_id, p_status) AS x(id, status)
                                    WHERE x.status = 'pending')
             ORDER BY s.permit_id, s.counter COLLATE "C") ps;
    -- Segments and permits are both in id order: one walk gives each permit its range.
    q := 1;
    FOR s IN 1..cardinality(g_permit) LOOP
        WHILE p_id[q] <> g_permit[s] LOOP
            q := q + 1;
        END LOOP;
        IF p_last[q] = 0 THEN
            p_first[q] := s;
        END IF;
        p_last[q] := s;
    END LOOP;

    -- 3. Each settlement in batch order: its answer and its permit's new row. None of
    --    this reads a counter, so it is decided, and the permits and segments written,
    --    BEFORE the counters are locked: the counter locks are held only for the counter
    --    arithmetic and the commit (what a hot team waits on).
    FOR t IN 1..n LOOP
        q := array_position(p_id, i_permit[t]);
        IF q IS NULL THEN
            results[t] := jsonb_build_object('unknown', true);
            CONTINUE;
        END IF;
        IF p_status[q] <> 'pending' THEN
            IF p_fp[q] = i_fp[t] THEN
                results[t] := jsonb_build_object(
                    'permit_id', p_id[q], 'kind', p_status[q],
                    'tokens_committed', p_tc[q], 'usd_committed', p_uc[q],
                    'tokens_liability', coalesce(p_tl[q], 0),
                    'usd_liability', coalesce(p_ul[q], 0),
                    'bound_exceeded', p_be[q], 'replay', true);
            ELSE
                results[t] := jsonb_build_object('conflict', true, 'kind', p_status[q]);
            END IF;
            CONTINUE;
        END IF;
        IF i_kind[t] <> 'invalid' THEN
            -- inferplane_check_parts_v2: every charged counter committed, nothing else named.
            v_bad := NULL;
            FOR s IN p_first[q]..p_last[q] LOOP
                IF (i_commits[t] -> g_counter[s]) IS NULL THEN
                    v_bad := g_counter[s];
                    EXIT;
                END IF;
            END LOOP;
            IF v_bad IS NOT NULL THEN
                results[t] := jsonb_build_object('bad_commits', v_bad,
                                                 'problem', 'missing for a charged counter');
                CONTINUE;
            END IF;
            IF i_nkeys[t] > p_last[q] - p_first[q] + 1 THEN
                SELECT ks.k INTO v_bad
                  FROM (SELECT jsonb_object_keys(i_commits[t]) AS k
                        UNION SELECT jsonb_object_keys(i_liabs[t])) ks
                 WHERE ks.k <> ALL (coalesce(g_counter[p_first[q]:p_last[q]], '{}'))
                 ORDER BY ks.k COLLATE "C" LIMIT 1;
                results[t] := jsonb_build_object(
                    'bad_commits', v_bad, 'problem', 'this permit did not charge that counter');
                CONTINUE;
            END IF;
            -- Its segments take their parts from its commits and liabilities (every one
            -- named, checked above) in the segments' UPDATE below.
            u_permit := u_permit || p_id[q];
            u_commits := u_commits || i_commits[t];
            u_liabs := u_liabs || i_liabs[t];
        END IF;
        applied := applied || t;
        applied_to := applied_to || q;
        p_status[q] := i_kind[t];
        p_fp[q] := i_fp[t];
        p_detail[q] := i_detail[t];
        p_tc[q] := i_tc[t];
        p_uc[q] := i_uc[t];
        p_tl[q] := i_tl[t];
        p_ul[q] := i_ul[t];
        p_be[q] := i_be[t];
        p_dirty[q] := true;
        results[t] := jsonb_build_object(
            'permit_id', p_id[q], 'kind', p_status[q],
            'tokens_committed', p_tc[q], 'usd_committed', p_uc[q],
            'tokens_liability', coalesce(p_tl[q], 0), 'usd_liability', coalesce(p_ul[q], 0),
            'bound_exceeded', p_be[q], 'replay', false);
    END LOOP;
    IF cardinality(applied) = 0 THEN
        RETURN to_jsonb(results);
    END IF;
    UPDATE permit_segments ps
       SET committed = (u.commits ->> ps.counter)::bigint,
           liability = coalesce((u.liabs ->> ps.counter)::bigint, 0)
      FROM unnest(u_permit, u_commits, u_liabs) AS u(permit_id, commits, liabs)
     WHERE ps.permit_id = u.permit_id;
    UPDATE permits p
       SET status = u.status, settle_fingerprint = u.fp, detail = u.detail,
           tokens_committed = u.tc, usd_committed = u.uc, tokens_liability = u.tl,
           usd_liability = u.ul, bound_exceeded = u.be, settled_at = clock_timestamp()
      FROM unnest(p_id, p_dirty, p_status, p_fp, p_detail, p_tc, p_uc, p_tl, p_ul, p_be)
           AS u(id, dirty, status, fp, detail, tc, uc, tl, ul, be)
     WHERE u.dirty AND p.id = u.id;

    -- 4. The accounts, then the counters, the settled permits charged, each locked in
    --    byte order by one statement (the global order: permits, accounts, counters).
    SELECT coalesce(array_agg(x.counter), '{}') INTO v_rows
      FROM unnest(g_permit, g_counter) AS x(permit_id, counter)
     WHERE x.permit_id IN (SELECT p_id[y.slot] FROM unnest(applied_to) AS y(slot));
    SELECT coalesce(array_agg(r.key), '{}'), coalesce(array_agg(r.acct), '{}'),
           coalesce(array_agg(r.balance), '{}'), coalesce(array_agg(r.updated_us), '{}'),
           coalesce(array_agg(r.reserved), '{}'), coalesce(array_agg(r.committed), '{}'),
           coalesce(array_agg(r.liability), '{}'), coalesce(array_agg(r.leased), '{}'),
           coalesce(array_agg(r.frozen), '{}'), coalesce(array_agg(r.lim), '{}'),
           coalesce(array_agg(r.hard), '{}')
      INTO s_key, s_acct, s_balance, s_updated, s_reserved, s_committed, s_liability,
           s_leased, s_frozen, s_limit, s_hard
      FROM (SELECT * FROM (SELECT a.key, true AS acct, NULL::bigint AS balance,
                                  NULL::bigint AS updated_us, a.reserved, a.committed,
                                  a.liability, a.leased_outstanding AS leased, a.frozen,
                                  a."limit" AS lim, a.hard
                             FROM authority_accounts a WHERE a.key = ANY(v_rows)
                            ORDER BY a.key COLLATE "C" FOR UPDATE) accounts
            UNION ALL
            SELECT * FROM (SELECT c.key, false, c.balance, c.updated_us, c.reserved,
                                  c.committed, c.liability, 0::bigint, c.frozen, c."limit",
                                  true
                             FROM counters c WHERE c.key = ANY(v_rows)
                            ORDER BY c.key COLLATE "C" FOR UPDATE) counters) r;
    SELECT coalesce(array_agg(array_position(s_key, x.k) ORDER BY x.o), '{}') INTO g_slot
      FROM unnest(g_counter) WITH ORDINALITY AS x(k, o);
    s_dirty := array_fill(false, ARRAY[cardinality(s_key)]);
    now_us := inferplane_now_us_v1();

    -- 5. The counter arithmetic of inferplane_settle_v2, settlement by settlement in batch
    --    order, on the running state; then one UPDATE per table.
    FOR m IN 1..cardinality(applied) LOOP
        t := applied[m];
        q := applied_to[m];
        FOR s IN p_first[q]..p_last[q] LOOP
            k := g_slot[s];
            CONTINUE WHEN k IS NULL;
            IF i_kind[t] = 'invalid' THEN
                -- Change no counter; freeze every money window/account the permit charged.
                IF g_kind[s] = 'account' OR (g_kind[s] = 'window' AND g_dim[s] = 'usd') THEN
                    s_frozen[k] := true;
                    s_dirty[k] := true;
                END IF;
                CONTINUE;
            END IF;
            v_commit := (i_commits[t] ->> g_counter[s])::bigint;
            v_liability := coalesce((i_liabs[t] ->> g_counter[s])::bigint, 0);
            IF g_kind[s] = 'bucket' THEN
                -- True-up exactly as inferplane_settle_v2.
                v_delta := (g_amount[s] - v_commit)::numeric * 60000000;
                IF v_delta > 0 THEN
                    v_delta := greatest(0, v_delta - g_limit[s]::numeric
                                           * greatest(0, now_us - p_admitted[q]));
                END IF;
                s_balance[k] := least(g_limit[s]::numeric * 60000000,
                                      inferplane_refill_v1(s_balance[k], g_limit[s],
                                                           now_us - s_updated[k])::numeric
                                      + v_delta)::bigint;
                s_updated[k] := greatest(s_updated[k], now_us);
            ELSE
                s_reserved[k] := s_reserved[k] - g_amount[s];
                s_committed[k] := s_committed[k] + v_commit;
                s_liability[k] := s_liability[k] + v_liability;
            END IF;
            s_dirty[k] := true;
        END LOOP;
    END LOOP;
    -- Accounts lock first, so s_acct[1] says whether any account was locked at all.
    IF s_acct[1] THEN
        UPDATE authority_accounts a
           SET reserved = u.reserved, committed = u.committed, liability = u.liability,
               frozen = u.frozen
          FROM unnest(s_key, s_acct, s_dirty, s_reserved, s_committed, s_liability,
                      s_frozen)
               AS u(key, acct, dirty, reserved, committed, liability, frozen)
         WHERE u.dirty AND u.acct AND a.key = u.key;
    END IF;
    UPDATE counters c
       SET balance = u.balance, updated_us = u.updated_us, reserved = u.reserved,
           committed = u.committed, liability = u.liability, frozen = u.frozen
      FROM unnest(s_key, s_acct, s_dirty, s_balance, s_updated, s_reserved, s_committed,
                  s_liability, s_frozen)
           AS u(key, acct, dirty, balance, updated_us, reserved, committed, liability,
                frozen)
     WHERE u.dirty AND NOT u.acct AND c.key = u.key;
    RETURN to_jsonb(results);
END
$$;
