-- inferplane_settle_v3: a batch of settlements decided set-based (issue 11;
-- docs/hot-team.md step 2).
--
-- Input: a JSON array of settlements, each inferplane_settle_v2's p_settlement plus its
-- "permit_id". Output: a JSON array, one result per settlement, in order, each exactly
-- what inferplane_settle_v2 would have answered for it at that point of a serial run
-- ({"permit_id", "kind", ...figures, "replay"}, {"conflict": true, "kind"},
-- {"unknown": true} or {"bad_commits", "problem"}): a permit settled twice in one batch
-- is a replay (same fingerprint) or a conflict the second time, as serially. Same
-- arithmetic as inferplane_settle_v2 (which stays installed and unchanged); what
-- changes is the work done under the locks: v2 runs one lock and two UPDATEs per
-- segment and several statements per permit; v3 runs a fixed number per batch:
--   1. the settlements parsed once into arrays;
--   2. the permits locked by one SELECT ... ORDER BY id FOR UPDATE, their segments read
--      in one statement;
--   3. each settlement's answer decided in batch order (unknown, replay, conflict, bad
--      commits, or settled: none of it reads a counter), and the permits and segments
--      written, one UPDATE each, BEFORE any counter is locked;
--   4. the accounts, then the counters, the settled permits charged, each locked by one
--      sorted SELECT ... FOR UPDATE (the global order: permits by id, accounts,
--      counters), and database time read once with every lock held;
--   5. each settlement's counter arithmetic applied to the running in-memory state, in
--      batch order; one UPDATE each for accounts and counters.
-- So a hot team's counter rows are held for the counter work and the commit only.
-- Frozen once released; a change is inferplane_settle_v4 in a new file and revision.

CREATE FUNCTION inferplane_settle_v3(p_items jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
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
    u_counter text[] := '{}';
    u_commit bigint[] := '{}';
    u_liab bigint[] := '{}';
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
    -- 1. Parse once.
    SELECT count(*),
           array_agg((e.d->>'permit_id')::uuid ORDER BY e.o),
           array_agg(e.d->>'kind' ORDER BY e.o),
           array_agg(e.d->>'fingerprint' ORDER BY e.o),
           array_agg(e.d->>'detail' ORDER BY e.o),
           array_agg((e.d->>'tokens_committed')::bigint ORDER BY e.o),
           array_agg((e.d->>'usd_committed')::bigint ORDER BY e.o),
           array_agg((e.d->>'tokens_liability')::bigint ORDER BY e.o),
           array_agg((e.d->>'usd_liability')::bigint ORDER BY e.o),
           array_agg(coalesce((e.d->>'bound_exceeded')::boolean, false) ORDER BY e.o),
           array_agg(coalesce(e.d->'commits', '{}') ORDER BY e.o),
           array_agg(coalesce(e.d->'liabilities', '{}') ORDER BY e.o),
           array_agg((SELECT count(*) FROM (
                          SELECT jsonb_object_keys(coalesce(e.d->'commits', '{}'))
                          UNION SELECT jsonb_object_keys(coalesce(e.d->'liabilities', '{}'))
                      ) ks)::int ORDER BY e.o)
      INTO n, i_permit, i_kind, i_fp, i_detail, i_tc, i_uc, i_tl, i_ul, i_be, i_commits,
           i_liabs, i_nkeys
      FROM jsonb_array_elements(p_items) WITH ORDINALITY AS e(d, o);
    IF n = 0 THEN
        RETURN '[]'::jsonb;
    END IF;
    results := array_fill(NULL::jsonb, ARRAY[n]);

    -- 2. The permits, locked in id order, and the pending ones' segments.
    SELECT coalesce(array_agg(p.id ORDER BY p.id), '{}'),
           array_agg(p.status ORDER BY p.id), array_agg(p.settle_fingerprint ORDER BY p.id),
           array_agg(p.detail ORDER BY p.id), array_agg(p.admitted_us ORDER BY p.id),
           array_agg(p.tokens_committed ORDER BY p.id), array_agg(p.usd_committed ORDER BY p.id),
           array_agg(p.tokens_liability ORDER BY p.id), array_agg(p.usd_liability ORDER BY p.id),
           array_agg(p.bound_exceeded ORDER BY p.id)
      INTO p_id, p_status, p_fp, p_detail, p_admitted, p_tc, p_uc, p_tl, p_ul, p_be
      FROM (SELECT * FROM permits WHERE id = ANY(i_permit) ORDER BY id FOR UPDATE) p;
    p_dirty := array_fill(false, ARRAY[cardinality(p_id)]);
    p_first := array_fill(1, ARRAY[cardinality(p_id)]);
    p_last := array_fill(0, ARRAY[cardinality(p_id)]);
    SELECT coalesce(array_agg(ps.permit_id ORDER BY ps.permit_id, ps.counter COLLATE "C"), '{}'),
           array_agg(ps.counter ORDER BY ps.permit_id, ps.counter COLLATE "C"),
           array_agg(ps.kind ORDER BY ps.permit_id, ps.counter COLLATE "C"),
           array_agg(ps.dimension ORDER BY ps.permit_id, ps.counter COLLATE "C"),
           array_agg(ps.amount ORDER BY ps.permit_id, ps.counter COLLATE "C"),
           array_agg(ps."limit" ORDER BY ps.permit_id, ps.counter COLLATE "C")
      INTO g_permit, g_counter, g_kind, g_dim, g_amount, g_limit
      FROM permit_segments ps
     WHERE ps.permit_id IN (SELECT x.id FROM unnest(p_id, p_status) AS x(id, status)
                             WHERE x.status = 'pending');
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
            FOR s IN p_first[q]..p_last[q] LOOP
                u_permit := u_permit || g_permit[s];
                u_counter := u_counter || g_counter[s];
                u_commit := u_commit || (i_commits[t] ->> g_counter[s])::bigint;
                u_liab := u_liab || coalesce((i_liabs[t] ->> g_counter[s])::bigint, 0);
            END LOOP;
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
       SET committed = u.commit, liability = u.liab
      FROM unnest(u_permit, u_counter, u_commit, u_liab) AS u(permit_id, counter, commit, liab)
     WHERE ps.permit_id = u.permit_id AND ps.counter = u.counter;
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
    SELECT * INTO s_key, s_acct, s_balance, s_updated, s_reserved, s_committed, s_liability,
                  s_leased, s_frozen, s_limit, s_hard, g_slot
      FROM inferplane_lock_rows_v3(v_rows, g_counter);
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
    UPDATE authority_accounts a
       SET reserved = u.reserved, committed = u.committed, liability = u.liability,
           frozen = u.frozen
      FROM unnest(s_key, s_acct, s_dirty, s_reserved, s_committed, s_liability, s_frozen)
           AS u(key, acct, dirty, reserved, committed, liability, frozen)
     WHERE u.dirty AND u.acct AND a.key = u.key;
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
