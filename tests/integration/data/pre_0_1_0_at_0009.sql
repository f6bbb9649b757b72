--
-- PostgreSQL database dump
--


-- Dumped from database version 15.20 (Debian 15.20-0+deb12u1)
-- Dumped by pg_dump version 15.20 (Debian 15.20-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: inferplane_admit_checked_v6(jsonb, jsonb[]); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_admit_checked_v6(p_requests jsonb, p_snapshot jsonb[]) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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

    -- 3. The rows the still-admissible requests charge, in one sorted pass.
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
          JOIN ROWS FROM (jsonb_to_recordset(p_requests)
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


--
-- Name: inferplane_admit_checked_v8(jsonb, jsonb[]); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_admit_checked_v8(p_requests jsonb, p_snapshot jsonb[]) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: inferplane_admit_one_v4(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_admit_one_v4(p_requests jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
BEGIN
    RETURN inferplane_admit_v2(p_requests);
END
$$;


--
-- Name: inferplane_admit_one_v5(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_admit_one_v5(p_requests jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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


--
-- Name: inferplane_admit_one_v7(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_admit_one_v7(p_requests jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $_$
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
$_$;


--
-- Name: inferplane_admit_v1(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_admit_v1(requests jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    n int := jsonb_array_length(requests);
    results jsonb[] := array_fill(NULL::jsonb, ARRAY[n]);
    cur_gen bigint;
    now_us bigint;
    ch jsonb;
    refusal jsonb;
    i int;
BEGIN
    -- 1. Definitions, in a fixed order: keys, teams, policy generation.
    PERFORM 1 FROM keys
     WHERE id IN (SELECT r->>'key_id' FROM jsonb_array_elements(requests) r)
     ORDER BY id COLLATE "C" FOR SHARE;
    PERFORM 1 FROM teams
     WHERE id IN (SELECT r->>'team_id' FROM jsonb_array_elements(requests) r)
     ORDER BY id COLLATE "C" FOR SHARE;
    SELECT ps.generation INTO cur_gen FROM policy_state ps FOR SHARE;
    FOR i IN 1..n LOOP
        results[i] := inferplane_check_snapshot_v1(requests->(i - 1), cur_gen);
    END LOOP;

    -- 2. Every counter the still-admissible requests charge, in one sorted pass.
    now_us := inferplane_now_us_v1();
    FOR ch IN
        SELECT DISTINCT ON (x->>'counter' COLLATE "C") x
          FROM generate_series(1, n) g, jsonb_array_elements(requests->(g - 1)->'charges') x
         WHERE results[g] IS NULL
         ORDER BY x->>'counter' COLLATE "C"
    LOOP
        PERFORM inferplane_lock_charge_v1(ch, now_us);
    END LOOP;
    -- Database time read with every lock held: no later admission can have refilled
    -- these buckets to a later instant.
    now_us := inferplane_now_us_v1();

    -- 3. Each request all-or-none, in order (a later request sees earlier reservations).
    FOR i IN 1..n LOOP
        CONTINUE WHEN results[i] IS NOT NULL;
        refusal := NULL;
        FOR ch IN SELECT x FROM jsonb_array_elements(requests->(i - 1)->'charges') x LOOP
            refusal := inferplane_check_charge_v1(ch, now_us);
            EXIT WHEN refusal IS NOT NULL;
        END LOOP;
        IF refusal IS NOT NULL THEN
            results[i] := refusal;
            CONTINUE;
        END IF;
        FOR ch IN SELECT x FROM jsonb_array_elements(requests->(i - 1)->'charges') x LOOP
            PERFORM inferplane_reserve_charge_v1(ch, now_us);
        END LOOP;
        results[i] := jsonb_build_object('permit_id',
                                         inferplane_write_permit_v1(requests->(i - 1), now_us));
    END LOOP;
    RETURN to_jsonb(results);
END
$$;


--
-- Name: inferplane_admit_v2(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_admit_v2(requests jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    n int := jsonb_array_length(requests);
    results jsonb[] := array_fill(NULL::jsonb, ARRAY[n]);
    cur_gen bigint;
    now_us bigint;
    ch jsonb;
    refusal jsonb;
    balances jsonb;
    i int;
BEGIN
    -- 1. Definitions, in a fixed order: keys, teams, policy generation.
    PERFORM 1 FROM keys
     WHERE id IN (SELECT r->>'key_id' FROM jsonb_array_elements(requests) r)
     ORDER BY id COLLATE "C" FOR SHARE;
    PERFORM 1 FROM teams
     WHERE id IN (SELECT r->>'team_id' FROM jsonb_array_elements(requests) r)
     ORDER BY id COLLATE "C" FOR SHARE;
    SELECT ps.generation INTO cur_gen FROM policy_state ps FOR SHARE;
    FOR i IN 1..n LOOP
        results[i] := inferplane_check_snapshot_v1(requests->(i - 1), cur_gen);
    END LOOP;

    -- 2. Every counter the still-admissible requests charge, in one sorted pass.
    now_us := inferplane_now_us_v1();
    FOR ch IN
        SELECT DISTINCT ON (x->>'counter' COLLATE "C") x
          FROM generate_series(1, n) g, jsonb_array_elements(requests->(g - 1)->'charges') x
         WHERE results[g] IS NULL
         ORDER BY x->>'counter' COLLATE "C"
    LOOP
        PERFORM inferplane_lock_charge_v1(ch, now_us);
    END LOOP;
    -- Database time read with every lock held (see inferplane_admit_v1).
    now_us := inferplane_now_us_v1();

    -- 3. Each request all-or-none, in order (a later request sees earlier reservations).
    FOR i IN 1..n LOOP
        CONTINUE WHEN results[i] IS NOT NULL;
        refusal := NULL;
        FOR ch IN SELECT x FROM jsonb_array_elements(requests->(i - 1)->'charges') x LOOP
            refusal := inferplane_check_charge_v2(ch, now_us);
            EXIT WHEN refusal IS NOT NULL;
        END LOOP;
        IF refusal IS NOT NULL THEN
            results[i] := refusal;
            CONTINUE;
        END IF;
        FOR ch IN SELECT x FROM jsonb_array_elements(requests->(i - 1)->'charges') x LOOP
            PERFORM inferplane_reserve_charge_v1(ch, now_us);
        END LOOP;
        SELECT coalesce(jsonb_object_agg(c.key, c.balance), '{}'::jsonb) INTO balances
          FROM counters c
         WHERE c.kind = 'bucket' AND c.key IN (
               SELECT x->>'counter' FROM jsonb_array_elements(requests->(i - 1)->'charges') x
                WHERE x->>'kind' = 'bucket');
        results[i] := jsonb_build_object('permit_id',
                                         inferplane_write_permit_v1(requests->(i - 1), now_us),
                                         'buckets', balances);
    END LOOP;
    RETURN to_jsonb(results);
END
$$;


--
-- Name: inferplane_admit_v3(json); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_admit_v3(p_requests json) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: inferplane_admit_v4(json); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_admit_v4(p_requests json) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
BEGIN
    RETURN inferplane_admit_v3(p_requests);
END
$$;


--
-- Name: inferplane_admit_v5(json); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_admit_v5(p_requests json) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
    RETURN inferplane_admit_v3(p_requests);
END
$$;


--
-- Name: inferplane_admit_v6(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_admit_v6(p_requests jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    SET max_parallel_workers_per_gather TO '0'
    AS $$
BEGIN
    IF jsonb_array_length(p_requests) = 0 THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN inferplane_admit_checked_v6(p_requests, inferplane_snapshot_v6(p_requests));
END
$$;


--
-- Name: inferplane_admit_v8(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_admit_v8(p_requests jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    SET max_parallel_workers_per_gather TO '0'
    AS $$
BEGIN
    IF jsonb_array_length(p_requests) = 0 THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN inferplane_admit_checked_v8(p_requests, inferplane_snapshot_v6(p_requests));
END
$$;


--
-- Name: inferplane_check_charge_v1(jsonb, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_check_charge_v1(ch jsonb, now_us bigint) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_key text := ch->>'counter';
    amount bigint := (ch->>'amount')::bigint;
    cap bigint := (ch->>'limit')::bigint;
    hard boolean := coalesce((ch->>'hard')::boolean, true);
    money boolean := ch->>'dimension' = 'usd';
    c record;
    a record;
    v_balance bigint;
BEGIN
    IF ch->>'kind' = 'bucket' THEN
        SELECT * INTO c FROM counters WHERE counters.key = ch->>'counter';
        v_balance := inferplane_refill_v1(c.balance, cap, now_us - c.updated_us);
        IF v_balance < least(amount, cap)::numeric * 60000000 THEN
            RETURN jsonb_build_object('status', 429, 'reason', 'rate_limited', 'counter', v_key,
                'retry_after', inferplane_retry_after_v1(v_balance, cap, amount));
        END IF;
    ELSIF ch->>'kind' = 'window' THEN
        SELECT * INTO c FROM counters WHERE counters.key = ch->>'counter';
        IF c.frozen THEN
            RETURN jsonb_build_object('status', 402, 'reason', 'account_frozen', 'counter', v_key);
        END IF;
        IF hard AND cap IS NOT NULL AND c.committed + c.reserved + amount > cap THEN
            RETURN jsonb_build_object('status', CASE WHEN money THEN 402 ELSE 429 END,
                'reason', CASE WHEN money THEN 'budget_exhausted' ELSE 'token_quota_exhausted' END,
                'counter', v_key);
        END IF;
    ELSE
        SELECT * INTO a FROM authority_accounts WHERE authority_accounts.key = ch->>'counter';
        IF a.frozen THEN
            RETURN jsonb_build_object('status', 402, 'reason', 'account_frozen', 'counter', v_key);
        END IF;
        IF hard AND cap IS NOT NULL
           AND a.committed + a.reserved + a.leased_outstanding + amount > cap THEN
            RETURN jsonb_build_object('status', 402, 'reason', 'budget_exhausted',
                                      'counter', v_key);
        END IF;
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: inferplane_check_charge_v2(jsonb, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_check_charge_v2(ch jsonb, now_us bigint) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_key text := ch->>'counter';
    amount bigint := (ch->>'amount')::bigint;
    cap bigint := (ch->>'limit')::bigint;
    hard boolean := coalesce((ch->>'hard')::boolean, true);
    money boolean := ch->>'dimension' = 'usd';
    c record;
    a record;
    v_balance bigint;
BEGIN
    IF ch->>'kind' = 'bucket' THEN
        SELECT * INTO c FROM counters WHERE counters.key = v_key;
        v_balance := inferplane_refill_v1(c.balance, cap, now_us - c.updated_us);
        IF v_balance < least(amount, cap)::numeric * 60000000 THEN
            RETURN jsonb_build_object('status', CASE WHEN money THEN 402 ELSE 429 END,
                'reason', 'rate_limited', 'counter', v_key,
                'retry_after', inferplane_retry_after_v1(v_balance, cap, amount),
                'limit', cap, 'amount', amount, 'dimension', ch->>'dimension');
        END IF;
        RETURN NULL;
    END IF;
    IF ch->>'kind' = 'window' THEN
        SELECT c2.committed, c2.reserved, c2.liability, c2.frozen, 0::bigint AS leased
          INTO a FROM counters c2 WHERE c2.key = v_key;
    ELSE
        SELECT a2.committed, a2.reserved, a2.liability, a2.frozen,
               a2.leased_outstanding AS leased
          INTO a FROM authority_accounts a2 WHERE a2.key = v_key;
    END IF;
    IF a.frozen THEN
        RETURN jsonb_build_object('status', 402, 'reason', 'account_frozen', 'counter', v_key);
    END IF;
    IF hard AND cap IS NOT NULL
       AND a.committed + a.liability + a.reserved + a.leased + amount > cap THEN
        RETURN jsonb_build_object('status', CASE WHEN money THEN 402 ELSE 429 END,
            'reason', CASE WHEN money THEN 'budget_exhausted' ELSE 'token_quota_exhausted' END,
            'counter', v_key, 'limit', cap, 'committed', a.committed,
            'liability', a.liability, 'reserved', a.reserved, 'leased', a.leased,
            'amount', amount, 'window', ch->>'window', 'dimension', ch->>'dimension');
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: inferplane_check_parts_v2(uuid, jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_check_parts_v2(p_permit uuid, p_settlement jsonb) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    v_bad text;
BEGIN
    SELECT ps.counter INTO v_bad FROM permit_segments ps
     WHERE ps.permit_id = p_permit AND (p_settlement->'commits'->ps.counter) IS NULL
     ORDER BY ps.counter COLLATE "C" LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RETURN jsonb_build_object('bad_commits', v_bad,
                                  'problem', 'missing for a charged counter');
    END IF;
    SELECT k INTO v_bad
      FROM (SELECT jsonb_object_keys(p_settlement->'commits') k
            UNION SELECT jsonb_object_keys(coalesce(p_settlement->'liabilities', '{}'))) ks
     WHERE NOT EXISTS (SELECT 1 FROM permit_segments ps
                        WHERE ps.permit_id = p_permit AND ps.counter = ks.k)
     ORDER BY k COLLATE "C" LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RETURN jsonb_build_object('bad_commits', v_bad,
                                  'problem', 'this permit did not charge that counter');
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: inferplane_check_snapshot_v1(jsonb, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_check_snapshot_v1(req jsonb, current_generation bigint) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    k record;
    team_revision bigint;
BEGIN
    SELECT * INTO k FROM keys WHERE id = req->>'key_id';
    IF NOT FOUND OR k.revoked_at IS NOT NULL
       OR (k.expires_at IS NOT NULL AND k.expires_at <= clock_timestamp())
       OR k.revision <> (req->>'key_revision')::bigint
       OR k.team_id <> req->>'team_id' THEN
        RETURN jsonb_build_object('status', 503, 'reason', 'snapshot_mismatch',
                                  'counter', 'key:' || (req->>'key_id'));
    END IF;
    SELECT revision INTO team_revision FROM teams WHERE id = req->>'team_id';
    IF team_revision IS DISTINCT FROM (req->>'team_revision')::bigint THEN
        RETURN jsonb_build_object('status', 503, 'reason', 'snapshot_mismatch',
                                  'counter', 'team:' || (req->>'team_id'));
    END IF;
    IF current_generation <> (req->>'policy_generation')::bigint THEN
        RETURN jsonb_build_object('status', 503, 'reason', 'snapshot_mismatch',
                                  'counter', 'policy');
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: inferplane_lease_apply_v1(jsonb, text, text, boolean, timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_lease_apply_v1(acc jsonb, p_plane text, p_frame text, p_open boolean, p_now timestamp with time zone) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_key text := acc->>'key';
    v_limit bigint := (acc->>'limit')::bigint;
    v_grant bigint := coalesce((acc->>'grant')::bigint, 0);
    v_want bigint := coalesce((acc->>'want')::bigint, 0);
    v_renew bigint := (acc->>'renew_ms')::bigint;
    r_committed bigint := (acc->>'committed')::bigint;
    r_liability bigint := coalesce((acc->>'liability')::bigint, 0);
    r_reserved bigint := coalesce((acc->>'reserved')::bigint, 0);
    a record;
    g record;
    -- the row before (b_*) and after adopting the report (n_*)
    b_contrib_c bigint; b_contrib_l bigint; b_contrib_o bigint;
    n_committed bigint; n_liability bigint; n_reserved bigint; n_allowance bigint;
    n_prior_c bigint; n_prior_u bigint; n_adoptions bigint;
    v_held bigint; v_others numeric; v_size bigint; v_footprint bigint; v_left bigint;
BEGIN
    SELECT * INTO a FROM authority_accounts WHERE key = v_key;
    SELECT * INTO g FROM lease_grants WHERE account = v_key AND dataplane = p_plane;

    b_contrib_c := g.prior_committed + g.committed;
    b_contrib_l := g.prior_unobserved + g.liability;
    b_contrib_o := greatest(g.allowance, g.committed + g.liability + g.reserved)
                   - g.committed - g.liability;

    -- adopt (gateway.lease._ledger.adopt)
    IF p_frame = g.frame AND r_committed >= g.committed THEN
        n_allowance := g.allowance;
        n_prior_c := g.prior_committed;
        n_prior_u := g.prior_unobserved;
        n_adoptions := g.adoptions;
    ELSE
        n_allowance := 0;
        n_prior_c := g.prior_committed + g.committed;
        n_prior_u := g.prior_unobserved
                     + greatest(g.allowance, g.committed + g.liability + g.reserved)
                     - g.committed;
        n_adoptions := g.adoptions + CASE WHEN g.frame <> '' THEN 1 ELSE 0 END;
    END IF;
    n_committed := r_committed;
    n_liability := r_liability;
    n_reserved := r_reserved;
    v_held := n_committed + n_liability + n_reserved;

    -- grant (gateway.lease._ledger.next_allowance); numeric: sums of bigints
    v_others := a.committed::numeric + a.liability + a.reserved + a.leased_outstanding
                - b_contrib_c - b_contrib_l - b_contrib_o + n_prior_c + n_prior_u;
    v_size := greatest(v_grant, least(v_want, coalesce(v_limit, 0)));
    IF v_limit IS NULL OR NOT p_open THEN
        n_allowance := greatest(n_allowance, v_held);
    ELSE
        n_allowance := greatest(n_allowance, v_held + least(
            v_size::numeric, greatest(0, v_limit - v_others - v_held))::bigint);
    END IF;
    v_footprint := greatest(n_allowance, v_held);
    v_left := CASE WHEN v_limit IS NULL THEN 0
                   ELSE greatest(0, v_limit - v_others - v_footprint)::bigint END;

    UPDATE lease_grants
       SET frame = p_frame, committed = n_committed, liability = n_liability,
           reserved = n_reserved, allowance = n_allowance, prior_committed = n_prior_c,
           prior_unobserved = n_prior_u, adoptions = n_adoptions,
           rule_uid = acc->>'rule_uid', renew_ms = v_renew,
           expires_at = p_now + make_interval(secs => 3 * v_renew / 1000.0),
           updated_at = p_now
     WHERE account = v_key AND dataplane = p_plane;
    UPDATE authority_accounts
       SET committed = committed + (n_prior_c + n_committed) - b_contrib_c,
           liability = liability + (n_prior_u + n_liability) - b_contrib_l,
           leased_outstanding = leased_outstanding
                                + (v_footprint - n_committed - n_liability) - b_contrib_o,
           "limit" = coalesce(v_limit, "limit"),
           hard = coalesce((acc->>'hard')::boolean, hard)
     WHERE key = v_key;

    RETURN jsonb_build_object(
        'key', v_key, 'rule_uid', acc->>'rule_uid', 'allowance', n_allowance,
        'renew_ms', v_renew, 'committed', n_committed, 'liability', n_liability,
        'reserved', n_reserved, 'grant', CASE WHEN p_open AND v_limit IS NOT NULL
                                               THEN v_size ELSE 0 END,
        'remaining', v_left, 'limit', v_limit, 'open', p_open AND v_limit IS NOT NULL);
END
$$;


--
-- Name: inferplane_lease_dataplanes_v1(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_lease_dataplanes_v1() RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
        'id', d.id, 'token_name', d.token_name, 'build', d.build,
        'api_versions', to_jsonb(d.api_versions), 'frame', d.frame,
        'applied_generation', d.applied_generation, 'rejections', d.rejections,
        'heartbeat_ms', d.heartbeat_ms, 'first_heartbeat', d.first_heartbeat,
        'last_heartbeat', d.last_heartbeat, 'heartbeats', d.heartbeats,
        'leases', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                'account', g.account, 'rule_uid', g.rule_uid, 'frame', g.frame,
                'allowance', g.allowance, 'committed', g.committed,
                'liability', g.liability, 'reserved', g.reserved,
                'prior_committed', g.prior_committed,
                'prior_unobserved', g.prior_unobserved, 'adoptions', g.adoptions,
                'renew_ms', g.renew_ms, 'expires_at', g.expires_at,
                'updated_at', g.updated_at) ORDER BY g.account COLLATE "C")
              FROM lease_grants g WHERE g.dataplane = d.id), '[]'::jsonb))
        ORDER BY d.id COLLATE "C"), '[]'::jsonb)
      FROM lease_dataplanes d
$$;


--
-- Name: inferplane_lease_lock_v1(jsonb, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_lease_lock_v1(acc jsonb, p_plane text) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_key text := acc->>'key';
BEGIN
    PERFORM 1 FROM authority_accounts WHERE key = v_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO authority_accounts (key, rule_uid, scope, window_period, "limit", hard)
        VALUES (v_key, acc->>'rule_uid', acc->>'scope', acc->>'period',
                (acc->>'limit')::bigint, coalesce((acc->>'hard')::boolean, true))
        ON CONFLICT (key) DO NOTHING;
        PERFORM 1 FROM authority_accounts WHERE key = v_key FOR UPDATE;
    END IF;
    -- A new grant row starts in no frame, so the first report is adopted as is.
    INSERT INTO lease_grants (account, dataplane, rule_uid, frame, renew_ms)
    VALUES (v_key, p_plane, acc->>'rule_uid', '', (acc->>'renew_ms')::bigint)
    ON CONFLICT (account, dataplane) DO NOTHING;
    PERFORM 1 FROM lease_grants WHERE account = v_key AND dataplane = p_plane FOR UPDATE;
END
$$;


--
-- Name: inferplane_lease_stored_v1(jsonb, text); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_lease_stored_v1(acc jsonb, p_plane text) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT jsonb_build_object(
        'key', g.account, 'rule_uid', g.rule_uid, 'allowance', g.allowance,
        'renew_ms', g.renew_ms, 'committed', g.committed, 'liability', g.liability,
        'reserved', g.reserved, 'grant', 0, 'remaining', 0, 'limit', a."limit",
        'open', false)
      FROM lease_grants g JOIN authority_accounts a ON a.key = g.account
     WHERE g.account = acc->>'key' AND g.dataplane = p_plane
$$;


--
-- Name: inferplane_lease_sync_v1(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_lease_sync_v1(req jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    dp jsonb := req->'dataplane';
    v_plane text := dp->>'id';
    v_frame text := dp->>'frame';
    v_boot text := dp->>'boot';
    v_seq bigint := (dp->>'seq')::bigint;
    v_now timestamptz := clock_timestamp();
    v_day text := to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD');
    v_month text := to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM');
    prev record;
    cur_gen bigint;
    v_apply boolean;
    v_open boolean;
    acc jsonb;
    leases jsonb := '[]'::jsonb;
BEGIN
    -- 1. The plane's own row first: two heartbeats of one plane serialise here.
    SELECT * INTO prev FROM lease_dataplanes WHERE id = v_plane FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO lease_dataplanes (id, token_name, frame, boot, seq, first_heartbeat)
        VALUES (v_plane, dp->>'token_name', v_frame, v_boot, -1, v_now)
        ON CONFLICT (id) DO NOTHING;
        SELECT * INTO prev FROM lease_dataplanes WHERE id = v_plane FOR UPDATE;
    END IF;

    -- 2. The generation the caller computed limits from must still be the published one.
    SELECT ps.generation INTO cur_gen FROM policy_state ps FOR SHARE;
    IF cur_gen <> (req->>'generation')::bigint THEN
        RETURN jsonb_build_object('status', 'stale_generation', 'generation', cur_gen);
    END IF;

    -- A late retry of an older heartbeat of the same process changes nothing.
    v_apply := NOT (prev.frame = v_frame AND prev.boot = v_boot AND prev.seq > v_seq);
    IF v_apply THEN
        UPDATE lease_dataplanes
           SET token_name = dp->>'token_name', build = coalesce(dp->>'build', ''),
               api_versions = ARRAY(SELECT jsonb_array_elements_text(
                                        coalesce(dp->'api_versions', '[]'::jsonb))),
               frame = v_frame, boot = v_boot, seq = v_seq,
               applied_generation = (dp->>'applied_generation')::bigint,
               rejections = coalesce(dp->'rejections', '[]'::jsonb),
               heartbeat_ms = (dp->>'heartbeat_ms')::bigint,
               last_heartbeat = v_now, heartbeats = heartbeats + 1
         WHERE id = v_plane;
    END IF;

    -- 3. Every account, in the lock order shared admission uses.
    FOR acc IN SELECT x FROM jsonb_array_elements(coalesce(req->'accounts', '[]'::jsonb)) x
                ORDER BY x->>'key' COLLATE "C"
    LOOP
        IF NOT v_apply THEN
            leases := leases || coalesce(inferplane_lease_stored_v1(acc, v_plane), '[]');
            CONTINUE;
        END IF;
        PERFORM inferplane_lease_lock_v1(acc, v_plane);
        -- A window that has ended takes no new grant; its late reports settle into it.
        v_open := NOT (SELECT frozen FROM authority_accounts WHERE key = acc->>'key')
                  AND acc->>'period' >= CASE WHEN acc->>'window' = 'day' THEN v_day
                                             ELSE v_month END;
        leases := leases || inferplane_lease_apply_v1(acc, v_plane, v_frame, v_open, v_now);
    END LOOP;

    RETURN jsonb_build_object(
        'status', CASE WHEN v_apply THEN 'ok' ELSE 'stale_heartbeat' END,
        'generation', cur_gen, 'day', v_day, 'month', v_month, 'leases', leases,
        'new_frame', v_apply AND prev.seq >= 0 AND prev.frame <> v_frame,
        'previous_frame', prev.frame);
END
$$;


--
-- Name: inferplane_lock_charge_v1(jsonb, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_lock_charge_v1(ch jsonb, now_us bigint) RETURNS void
    LANGUAGE plpgsql
    AS $_$
DECLARE
    v_uid text := ch->>'rule_uid';
    v_key text := ch->>'counter';
BEGIN
    IF ch->>'kind' = 'account' THEN
        PERFORM 1 FROM authority_accounts WHERE key = v_key FOR UPDATE;
        IF FOUND THEN
            RETURN;
        END IF;
        INSERT INTO authority_accounts AS a
               (key, rule_uid, scope, window_period, "limit", hard)
        VALUES (v_key, v_uid,
                regexp_replace(substr(v_key, length('account:' || coalesce(v_uid, '') || ':') + 1),
                               ':(day|month):[^:]*$', ''),
                ch->>'window', (ch->>'limit')::bigint, coalesce((ch->>'hard')::boolean, true))
        ON CONFLICT (key) DO NOTHING;
        PERFORM 1 FROM authority_accounts WHERE key = v_key FOR UPDATE;
    ELSE
        PERFORM 1 FROM counters WHERE key = v_key FOR UPDATE;
        IF FOUND THEN
            RETURN;
        END IF;
        -- A new bucket starts full.
        INSERT INTO counters AS c
               (key, kind, dimension, "limit", balance, updated_us, "window")
        VALUES (v_key, ch->>'kind', ch->>'dimension', (ch->>'limit')::bigint,
                CASE WHEN ch->>'kind' = 'bucket'
                     THEN (ch->>'limit')::bigint * 60000000 END,
                CASE WHEN ch->>'kind' = 'bucket' THEN now_us END,
                ch->>'window')
        ON CONFLICT (key) DO NOTHING;
        PERFORM 1 FROM counters WHERE key = v_key FOR UPDATE;
    END IF;
END
$_$;


--
-- Name: inferplane_lock_rows_v3(text[], text[]); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_lock_rows_v3(p_keys text[], p_for text[], OUT o_keys text[], OUT o_acct boolean[], OUT o_balance bigint[], OUT o_updated_us bigint[], OUT o_reserved bigint[], OUT o_committed bigint[], OUT o_liability bigint[], OUT o_leased bigint[], OUT o_frozen boolean[], OUT o_lim bigint[], OUT o_hard boolean[], OUT o_slots integer[]) RETURNS record
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: inferplane_lock_segments_v2(uuid); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_lock_segments_v2(p_permit uuid) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT counter, kind FROM permit_segments WHERE permit_id = p_permit
              ORDER BY counter COLLATE "C" LOOP
        IF s.kind = 'account' THEN
            PERFORM 1 FROM authority_accounts WHERE key = s.counter FOR UPDATE;
        ELSE
            PERFORM 1 FROM counters WHERE key = s.counter FOR UPDATE;
        END IF;
    END LOOP;
END
$$;


--
-- Name: inferplane_now_us_v1(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_now_us_v1() RETURNS bigint
    LANGUAGE sql
    AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: permits; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.permits (
    id uuid NOT NULL,
    request_id text NOT NULL,
    key_id text NOT NULL,
    team_id text NOT NULL,
    user_name text,
    model text NOT NULL,
    token_bound bigint NOT NULL,
    usd_bound bigint NOT NULL,
    generation bigint NOT NULL,
    day text NOT NULL,
    month text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    settle_fingerprint text,
    detail text,
    tokens_committed bigint,
    usd_committed bigint,
    admitted_us bigint NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    settled_at timestamp with time zone,
    tokens_liability bigint,
    usd_liability bigint,
    bound_exceeded boolean DEFAULT false NOT NULL,
    resolved_at timestamp with time zone,
    CONSTRAINT permits_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'complete'::text, 'tokens_known'::text, 'uncertain'::text, 'invalid'::text, 'cancelled'::text])))
);


--
-- Name: inferplane_record_v2(uuid, jsonb, boolean); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_record_v2(p_permit uuid, p_settlement jsonb, p_resolution boolean) RETURNS public.permits
    LANGUAGE sql
    AS $$
    UPDATE permits
       SET status = p_settlement->>'kind', settle_fingerprint = p_settlement->>'fingerprint',
           detail = p_settlement->>'detail',
           tokens_committed = (p_settlement->>'tokens_committed')::bigint,
           usd_committed = (p_settlement->>'usd_committed')::bigint,
           tokens_liability = (p_settlement->>'tokens_liability')::bigint,
           usd_liability = (p_settlement->>'usd_liability')::bigint,
           bound_exceeded = coalesce((p_settlement->>'bound_exceeded')::boolean, false),
           settled_at = CASE WHEN p_resolution THEN settled_at ELSE clock_timestamp() END,
           resolved_at = CASE WHEN p_resolution THEN clock_timestamp() ELSE resolved_at END
     WHERE id = p_permit
    RETURNING *
$$;


--
-- Name: inferplane_refill_v1(bigint, bigint, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_refill_v1(balance bigint, capacity bigint, elapsed_us bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN elapsed_us <= 0 THEN balance
                ELSE least(capacity::numeric * 60000000,
                           balance::numeric + capacity::numeric * elapsed_us)::bigint END
$$;


--
-- Name: inferplane_reserve_charge_v1(jsonb, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_reserve_charge_v1(ch jsonb, now_us bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    amount bigint := (ch->>'amount')::bigint;
    cap bigint := (ch->>'limit')::bigint;
BEGIN
    IF ch->>'kind' = 'bucket' THEN
        UPDATE counters
           SET balance = inferplane_refill_v1(balance, cap, now_us - updated_us)
                         - amount * 60000000,
               -- never move a bucket's clock backwards (refill would count twice)
               updated_us = greatest(updated_us, now_us),
               "limit" = cap
         WHERE key = ch->>'counter';
    ELSIF ch->>'kind' = 'window' THEN
        UPDATE counters SET reserved = reserved + amount, "limit" = cap
         WHERE key = ch->>'counter';
    ELSE
        UPDATE authority_accounts
           SET reserved = reserved + amount, "limit" = cap,
               hard = coalesce((ch->>'hard')::boolean, true)
         WHERE key = ch->>'counter';
    END IF;
END
$$;


--
-- Name: inferplane_resolve_v2(uuid, jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_resolve_v2(p_permit uuid, p_settlement jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    p permits;
    s record;
    v_commit bigint;
    v_liability bigint;
    v_bad jsonb;
BEGIN
    SELECT * INTO p FROM permits WHERE id = p_permit FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('unknown', true);
    END IF;
    IF p.status = 'pending' THEN
        RETURN inferplane_settle_v2(p_permit, p_settlement);
    END IF;
    IF p.status NOT IN ('uncertain', 'tokens_known') THEN
        RETURN jsonb_build_object('conflict', true, 'kind', p.status);
    END IF;
    v_bad := inferplane_check_parts_v2(p_permit, p_settlement);
    IF v_bad IS NOT NULL THEN
        RETURN v_bad;
    END IF;
    PERFORM inferplane_lock_segments_v2(p_permit);
    FOR s IN SELECT * FROM permit_segments WHERE permit_id = p_permit AND kind <> 'bucket'
              ORDER BY counter COLLATE "C" LOOP
        v_commit := (p_settlement->'commits'->>s.counter)::bigint;
        v_liability := coalesce((p_settlement->'liabilities'->>s.counter)::bigint, 0);
        IF s.kind = 'window' THEN
            UPDATE counters
               SET committed = greatest(0, committed + v_commit - coalesce(s.committed, 0)),
                   liability = greatest(0, liability + v_liability - coalesce(s.liability, 0))
             WHERE key = s.counter;
        ELSE
            UPDATE authority_accounts
               SET committed = greatest(0, committed + v_commit - coalesce(s.committed, 0)),
                   liability = greatest(0, liability + v_liability - coalesce(s.liability, 0))
             WHERE key = s.counter;
        END IF;
        UPDATE permit_segments SET committed = v_commit, liability = v_liability
         WHERE permit_id = p_permit AND counter = s.counter;
    END LOOP;
    RETURN inferplane_settle_result_v2(inferplane_record_v2(p_permit, p_settlement, true),
                                       false);
END
$$;


--
-- Name: inferplane_resolve_v4(uuid, jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_resolve_v4(p_permit uuid, p_settlement jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
BEGIN
    RETURN inferplane_resolve_v2(p_permit, p_settlement);
END
$$;


--
-- Name: inferplane_resolve_v5(uuid, jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_resolve_v5(p_permit uuid, p_settlement jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
    RETURN inferplane_resolve_v2(p_permit, p_settlement);
END
$$;


--
-- Name: inferplane_retry_after_v1(bigint, bigint, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_retry_after_v1(balance bigint, capacity bigint, amount bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN need <= 0 THEN 0
                ELSE greatest(1, ceil(ceil(need / capacity) / 1000000))::bigint END
    FROM (SELECT least(amount, capacity)::numeric * 60000000 - balance AS need) n
$$;


--
-- Name: inferplane_settle_admit_v3(jsonb, json); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_admit_v3(p_items jsonb, p_requests json) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_snapshot jsonb[];
    v_permits uuid[];
    v_rows text[];
    v_accounts int;
    v_found int;
    v_key text;
    ch jsonb;
    now_us bigint;
BEGIN
    v_snapshot := inferplane_snapshot_v3(p_requests);
    SELECT coalesce(array_agg(DISTINCT (e.d->>'permit_id')::uuid), '{}') INTO v_permits
      FROM jsonb_array_elements(p_items) AS e(d);
    PERFORM 1 FROM permits WHERE id = ANY(v_permits) ORDER BY id FOR UPDATE;

    -- Every account and counter either side will take, sorted.
    SELECT coalesce(array_agg(u.key ORDER BY u.key COLLATE "C"), '{}') INTO v_rows
      FROM (SELECT ps.counter AS key FROM permit_segments ps
             WHERE ps.permit_id = ANY(v_permits)
            UNION
            SELECT c.counter FROM json_array_elements(p_requests) WITH ORDINALITY AS r(doc, o),
                   json_to_recordset(r.doc->'charges') AS c(counter text)
             WHERE v_snapshot[r.o] IS NULL) u;
    SELECT (SELECT count(*) FROM authority_accounts WHERE key = ANY(v_rows)),
           (SELECT count(*) FROM counters WHERE key = ANY(v_rows))
      INTO v_accounts, v_found;
    IF v_accounts + v_found < cardinality(v_rows) THEN
        -- A row is new (a charge's window or account): v1's row-by-row path, in order.
        now_us := inferplane_now_us_v1();
        FOREACH v_key IN ARRAY v_rows LOOP
            SELECT c.doc INTO ch
              FROM json_array_elements(p_requests) WITH ORDINALITY AS r(doc, o),
                   json_array_elements(r.doc->'charges') AS c(doc)
             WHERE v_snapshot[r.o] IS NULL AND c.doc->>'counter' = v_key LIMIT 1;
            IF ch IS NULL THEN
                IF starts_with(v_key, 'account:') THEN
                    PERFORM 1 FROM authority_accounts WHERE key = v_key FOR UPDATE;
                ELSE
                    PERFORM 1 FROM counters WHERE key = v_key FOR UPDATE;
                END IF;
            ELSE
                PERFORM inferplane_lock_charge_v1(ch, now_us);
            END IF;
        END LOOP;
    ELSE
        PERFORM inferplane_lock_rows_v3(v_rows, '{}');
    END IF;

    RETURN jsonb_build_object('settled', inferplane_settle_v3(p_items),
                              'admitted', inferplane_admit_v3(p_requests));
END
$$;


--
-- Name: inferplane_settle_admit_v4(jsonb, json); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_admit_v4(p_items jsonb, p_requests json) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
BEGIN
    RETURN inferplane_settle_admit_v3(p_items, p_requests);
END
$$;


--
-- Name: inferplane_settle_admit_v5(jsonb, json); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_admit_v5(p_items jsonb, p_requests json) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
    RETURN inferplane_settle_admit_v3(p_items, p_requests);
END
$$;


--
-- Name: inferplane_settle_admit_v6(jsonb, jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_admit_v6(p_items jsonb, p_requests jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    SET max_parallel_workers_per_gather TO '0'
    AS $$
DECLARE
    v_snapshot jsonb[];
    v_permits uuid[];
    v_rows text[];
    v_accounts int;
    v_found int;
    v_key text;
    ch jsonb;
    now_us bigint;
BEGIN
    v_snapshot := inferplane_snapshot_v6(p_requests);
    SELECT coalesce(array_agg(DISTINCT (e.d->>'permit_id')::uuid), '{}') INTO v_permits
      FROM jsonb_array_elements(p_items) AS e(d);
    PERFORM 1 FROM permits WHERE id = ANY(v_permits) ORDER BY id FOR UPDATE;

    -- Every account and counter either side will take, sorted.
    SELECT coalesce(array_agg(u.key ORDER BY u.key COLLATE "C"), '{}') INTO v_rows
      FROM (SELECT ps.counter AS key FROM permit_segments ps
             WHERE ps.permit_id = ANY(v_permits)
            UNION
            SELECT c.counter FROM jsonb_array_elements(p_requests) WITH ORDINALITY AS r(doc, o),
                   jsonb_to_recordset(r.doc->'charges') AS c(counter text)
             WHERE v_snapshot[r.o] IS NULL) u;
    SELECT (SELECT count(*) FROM authority_accounts WHERE key = ANY(v_rows)),
           (SELECT count(*) FROM counters WHERE key = ANY(v_rows))
      INTO v_accounts, v_found;
    IF v_accounts + v_found < cardinality(v_rows) THEN
        -- A row is new (a charge's window or account): v1's row-by-row path, in order.
        now_us := inferplane_now_us_v1();
        FOREACH v_key IN ARRAY v_rows LOOP
            SELECT c.doc INTO ch
              FROM jsonb_array_elements(p_requests) WITH ORDINALITY AS r(doc, o),
                   jsonb_array_elements(r.doc->'charges') AS c(doc)
             WHERE v_snapshot[r.o] IS NULL AND c.doc->>'counter' = v_key LIMIT 1;
            IF ch IS NULL THEN
                IF starts_with(v_key, 'account:') THEN
                    PERFORM 1 FROM authority_accounts WHERE key = v_key FOR UPDATE;
                ELSE
                    PERFORM 1 FROM counters WHERE key = v_key FOR UPDATE;
                END IF;
            ELSE
                PERFORM inferplane_lock_charge_v1(ch, now_us);
            END IF;
        END LOOP;
    ELSE
        -- Accounts, then counters, each in byte order (what inferplane_lock_rows_v3 locks
        -- here in v3, without the arrays it builds, which nothing here reads).
        PERFORM 1 FROM authority_accounts WHERE key = ANY(v_rows)
         ORDER BY key COLLATE "C" FOR UPDATE;
        PERFORM 1 FROM counters WHERE key = ANY(v_rows) ORDER BY key COLLATE "C" FOR UPDATE;
    END IF;

    RETURN jsonb_build_object('settled', inferplane_settle_v6(p_items),
                              'admitted', inferplane_admit_checked_v6(p_requests, v_snapshot));
END
$$;


--
-- Name: inferplane_settle_one_v4(uuid, jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_one_v4(p_permit uuid, p_settlement jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
BEGIN
    RETURN inferplane_settle_v2(p_permit, p_settlement);
END
$$;


--
-- Name: inferplane_settle_one_v5(uuid, jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_one_v5(p_permit uuid, p_settlement jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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


--
-- Name: inferplane_settle_one_v7(uuid, jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_one_v7(p_permit uuid, p_settlement jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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


--
-- Name: inferplane_settle_result_v2(public.permits, boolean); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_result_v2(p public.permits, p_replay boolean) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT jsonb_build_object('permit_id', p.id, 'kind', p.status,
                              'tokens_committed', p.tokens_committed,
                              'usd_committed', p.usd_committed,
                              'tokens_liability', coalesce(p.tokens_liability, 0),
                              'usd_liability', coalesce(p.usd_liability, 0),
                              'bound_exceeded', p.bound_exceeded, 'replay', p_replay)
$$;


--
-- Name: inferplane_settle_v1(uuid, text, text, jsonb, text, bigint, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_v1(p_permit uuid, p_kind text, p_fingerprint text, p_commits jsonb, p_detail text, p_tokens bigint, p_usd bigint) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    p record;
    s record;
    now_us bigint;
    v_commit bigint;
    v_tokens bigint;
    v_usd bigint;
    v_bad text;
    v_delta numeric;
    v_reserved_us bigint;
BEGIN
    SELECT * INTO p FROM permits WHERE id = p_permit FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('unknown', true);
    END IF;
    IF p.status <> 'pending' THEN
        IF p.settle_fingerprint = p_fingerprint THEN
            RETURN jsonb_build_object('permit_id', p.id, 'kind', p.status,
                                      'tokens_committed', p.tokens_committed,
                                      'usd_committed', p.usd_committed, 'replay', true);
        END IF;
        RETURN jsonb_build_object('conflict', true, 'kind', p.status);
    END IF;

    IF p_kind <> 'invalid' THEN
        SELECT ps.counter INTO v_bad FROM permit_segments ps
         WHERE ps.permit_id = p_permit AND (p_commits -> ps.counter) IS NULL
         ORDER BY ps.counter COLLATE "C" LIMIT 1;
        IF v_bad IS NOT NULL THEN
            RETURN jsonb_build_object('bad_commits', v_bad,
                                      'problem', 'missing for a charged counter');
        END IF;
        SELECT k INTO v_bad FROM jsonb_object_keys(p_commits) k
         WHERE NOT EXISTS (SELECT 1 FROM permit_segments ps
                            WHERE ps.permit_id = p_permit AND ps.counter = k)
         ORDER BY k COLLATE "C" LIMIT 1;
        IF v_bad IS NOT NULL THEN
            RETURN jsonb_build_object('bad_commits', v_bad,
                                      'problem', 'this permit did not charge that counter');
        END IF;
    END IF;

    FOR s IN SELECT * FROM permit_segments WHERE permit_id = p_permit
              ORDER BY counter COLLATE "C" LOOP
        IF s.kind = 'account' THEN
            PERFORM 1 FROM authority_accounts WHERE key = s.counter FOR UPDATE;
        ELSE
            PERFORM 1 FROM counters WHERE key = s.counter FOR UPDATE;
        END IF;
    END LOOP;
    now_us := inferplane_now_us_v1();
    v_reserved_us := p.admitted_us;

    IF p_kind = 'invalid' THEN
        -- Change no counter; freeze every money window/account the permit charged.
        UPDATE counters SET frozen = true
         WHERE key IN (SELECT counter FROM permit_segments
                        WHERE permit_id = p_permit AND kind = 'window' AND dimension = 'usd');
        UPDATE authority_accounts SET frozen = true
         WHERE key IN (SELECT counter FROM permit_segments
                        WHERE permit_id = p_permit AND kind = 'account');
        v_tokens := 0;
        v_usd := 0;
    ELSE
        FOR s IN SELECT * FROM permit_segments WHERE permit_id = p_permit
                  ORDER BY counter COLLATE "C" LOOP
            v_commit := (p_commits->>s.counter)::bigint;
            IF s.kind = 'bucket' THEN
                -- Refill to now, then true up against the captured capacity: credit the
                -- unused part (never above capacity) or debit the excess (debt). A credit
                -- is reduced by all the refill the reservation's lifetime could have
                -- added, so an old reservation's release never hands a newer request
                -- capacity it would not have had (ADR-046); same as _plan.bucket_settle.
                v_delta := (s.amount - v_commit)::numeric * 60000000;
                IF v_delta > 0 THEN
                    v_delta := greatest(0, v_delta - s."limit"::numeric
                                                     * greatest(0, now_us - v_reserved_us));
                END IF;
                UPDATE counters
                   SET balance = least(s."limit"::numeric * 60000000,
                                       inferplane_refill_v1(balance, s."limit",
                                                            now_us - updated_us)::numeric
                                       + v_delta)::bigint,
                       updated_us = greatest(updated_us, now_us)
                 WHERE key = s.counter;
            ELSIF s.kind = 'window' THEN
                UPDATE counters SET reserved = reserved - s.amount,
                                    committed = committed + v_commit
                 WHERE key = s.counter;
            ELSE
                UPDATE authority_accounts SET reserved = reserved - s.amount,
                                              committed = committed + v_commit
                 WHERE key = s.counter;
            END IF;
            UPDATE permit_segments SET committed = v_commit
             WHERE permit_id = p_permit AND counter = s.counter;
        END LOOP;
        v_tokens := coalesce(p_tokens, p.token_bound);
        v_usd := coalesce(p_usd, p.usd_bound);
    END IF;

    UPDATE permits SET status = p_kind, settle_fingerprint = p_fingerprint,
                       detail = p_detail, tokens_committed = v_tokens,
                       usd_committed = v_usd, settled_at = clock_timestamp()
     WHERE id = p_permit;
    RETURN jsonb_build_object('permit_id', p.id, 'kind', p_kind, 'tokens_committed', v_tokens,
                              'usd_committed', v_usd, 'replay', false);
END
$$;


--
-- Name: inferplane_settle_v2(uuid, jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_v2(p_permit uuid, p_settlement jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
DECLARE
    p permits;
    s record;
    now_us bigint;
    v_kind text := p_settlement->>'kind';
    v_commit bigint;
    v_liability bigint;
    v_delta numeric;
    v_bad jsonb;
BEGIN
    SELECT * INTO p FROM permits WHERE id = p_permit FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('unknown', true);
    END IF;
    IF p.status <> 'pending' THEN
        IF p.settle_fingerprint = p_settlement->>'fingerprint' THEN
            RETURN inferplane_settle_result_v2(p, true);
        END IF;
        RETURN jsonb_build_object('conflict', true, 'kind', p.status);
    END IF;
    IF v_kind <> 'invalid' THEN
        v_bad := inferplane_check_parts_v2(p_permit, p_settlement);
        IF v_bad IS NOT NULL THEN
            RETURN v_bad;
        END IF;
    END IF;

    PERFORM inferplane_lock_segments_v2(p_permit);
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
        FOR s IN SELECT * FROM permit_segments WHERE permit_id = p_permit
                  ORDER BY counter COLLATE "C" LOOP
            v_commit := (p_settlement->'commits'->>s.counter)::bigint;
            v_liability := coalesce((p_settlement->'liabilities'->>s.counter)::bigint, 0);
            IF s.kind = 'bucket' THEN
                -- True-up exactly as inferplane_settle_v1 (credit reduced by the refill
                -- the reservation's lifetime could add; debit into debt).
                v_delta := (s.amount - v_commit)::numeric * 60000000;
                IF v_delta > 0 THEN
                    v_delta := greatest(0, v_delta - s."limit"::numeric
                                                     * greatest(0, now_us - p.admitted_us));
                END IF;
                UPDATE counters
                   SET balance = least(s."limit"::numeric * 60000000,
                                       inferplane_refill_v1(balance, s."limit",
                                                            now_us - updated_us)::numeric
                                       + v_delta)::bigint,
                       updated_us = greatest(updated_us, now_us)
                 WHERE key = s.counter;
            ELSIF s.kind = 'window' THEN
                UPDATE counters SET reserved = reserved - s.amount,
                                    committed = committed + v_commit,
                                    liability = liability + v_liability
                 WHERE key = s.counter;
            ELSE
                UPDATE authority_accounts SET reserved = reserved - s.amount,
                                              committed = committed + v_commit,
                                              liability = liability + v_liability
                 WHERE key = s.counter;
            END IF;
            UPDATE permit_segments SET committed = v_commit, liability = v_liability
             WHERE permit_id = p_permit AND counter = s.counter;
        END LOOP;
    END IF;

    RETURN inferplane_settle_result_v2(inferplane_record_v2(p_permit, p_settlement, false),
                                       false);
END
$$;


--
-- Name: inferplane_settle_v3(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_v3(p_items jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: inferplane_settle_v4(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_v4(p_items jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $$
BEGIN
    RETURN inferplane_settle_v3(p_items);
END
$$;


--
-- Name: inferplane_settle_v5(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_v5(p_items jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
    RETURN inferplane_settle_v3(p_items);
END
$$;


--
-- Name: inferplane_settle_v6(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_v6(p_items jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    SET max_parallel_workers_per_gather TO '0'
    AS $$
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


--
-- Name: inferplane_settle_v8(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_settle_v8(p_items jsonb) RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET plan_cache_mode TO 'force_generic_plan'
    SET max_parallel_workers_per_gather TO '0'
    AS $$
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


--
-- Name: inferplane_snapshot_v3(json); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_snapshot_v3(p_requests json) RETURNS jsonb[]
    LANGUAGE plpgsql
    AS $$
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


--
-- Name: inferplane_snapshot_v6(jsonb); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_snapshot_v6(p_requests jsonb) RETURNS jsonb[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    cur_gen bigint;
    results jsonb[];
BEGIN
    PERFORM 1 FROM keys
     WHERE id IN (SELECT r.key_id FROM jsonb_to_recordset(p_requests) AS r(key_id text))
     ORDER BY id COLLATE "C" FOR SHARE;
    PERFORM 1 FROM teams
     WHERE id IN (SELECT r.team_id FROM jsonb_to_recordset(p_requests) AS r(team_id text))
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
      FROM ROWS FROM (jsonb_to_recordset(p_requests)
                      AS (key_id text, key_revision bigint, team_id text,
                          team_revision bigint, policy_generation bigint))
           WITH ORDINALITY AS q(key_id, key_revision, team_id, team_revision,
                                policy_generation, o)
      LEFT JOIN keys k ON k.id = q.key_id
      LEFT JOIN teams t ON t.id = q.team_id;
    RETURN results;
END
$$;


--
-- Name: inferplane_write_permit_v1(jsonb, bigint); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.inferplane_write_permit_v1(req jsonb, now_us bigint) RETURNS uuid
    LANGUAGE plpgsql
    AS $$
DECLARE
    pid uuid := gen_random_uuid();
BEGIN
    INSERT INTO permits (id, request_id, key_id, team_id, user_name, model, token_bound,
                         usd_bound, generation, day, month, admitted_us)
    VALUES (pid, req->>'request_id', req->>'key_id', req->>'team_id', req->>'user',
            req->>'model', (req->>'token_bound')::bigint, (req->>'usd_bound')::bigint,
            (req->>'policy_generation')::bigint, req->>'day', req->>'month', now_us);
    INSERT INTO permit_segments (permit_id, counter, kind, dimension, amount, "limit",
                                 "window", rule_uid, hard)
    SELECT pid, ch->>'counter', ch->>'kind', ch->>'dimension', (ch->>'amount')::bigint,
           (ch->>'limit')::bigint, ch->>'window', ch->>'rule_uid',
           coalesce((ch->>'hard')::boolean, true)
      FROM jsonb_array_elements(req->'charges') ch;
    RETURN pid;
END
$$;


--
-- Name: alembic_version; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.alembic_version (
    version_num character varying(32) NOT NULL
);


--
-- Name: alert_events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.alert_events (
    counter text NOT NULL,
    "window" text NOT NULL,
    threshold smallint NOT NULL,
    "limit" bigint NOT NULL,
    committed bigint NOT NULL,
    liability bigint NOT NULL,
    reserved bigint NOT NULL,
    replica text NOT NULL,
    first_seen_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    delivered_at timestamp with time zone,
    attempts integer DEFAULT 0 NOT NULL,
    last_error text,
    CONSTRAINT alert_events_threshold_check CHECK ((threshold = ANY (ARRAY[80, 90, 100])))
);


--
-- Name: authority_accounts; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.authority_accounts (
    key text NOT NULL,
    rule_uid text,
    scope text,
    window_period text,
    "limit" bigint,
    hard boolean DEFAULT true NOT NULL,
    reserved bigint DEFAULT 0 NOT NULL,
    committed bigint DEFAULT 0 NOT NULL,
    leased_outstanding bigint DEFAULT 0 NOT NULL,
    frozen boolean DEFAULT false NOT NULL,
    liability bigint DEFAULT 0 NOT NULL
);


--
-- Name: authority_namespace; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.authority_namespace (
    singleton boolean DEFAULT true NOT NULL,
    namespace uuid DEFAULT gen_random_uuid() NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT authority_namespace_singleton_check CHECK (singleton)
);


--
-- Name: bootstrap_declarations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.bootstrap_declarations (
    kind text NOT NULL,
    name text NOT NULL,
    fingerprint text NOT NULL,
    declared_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- Name: counters; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.counters (
    key text NOT NULL,
    kind text NOT NULL,
    dimension text NOT NULL,
    "limit" bigint,
    balance bigint,
    updated_us bigint,
    "window" text,
    reserved bigint DEFAULT 0 NOT NULL,
    committed bigint DEFAULT 0 NOT NULL,
    frozen boolean DEFAULT false NOT NULL,
    liability bigint DEFAULT 0 NOT NULL,
    CONSTRAINT counters_dimension_check CHECK ((dimension = ANY (ARRAY['requests'::text, 'tokens'::text, 'usd'::text]))),
    CONSTRAINT counters_kind_check CHECK ((kind = ANY (ARRAY['bucket'::text, 'window'::text])))
);


--
-- Name: keys; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.keys (
    id text NOT NULL,
    team_id text NOT NULL,
    key_hash text NOT NULL,
    display_prefix text NOT NULL,
    name text DEFAULT ''::text NOT NULL,
    user_name text,
    allowed_models text[],
    rpm bigint,
    tpm bigint,
    usd_micros_per_day bigint,
    usd_micros_per_month bigint,
    expires_at timestamp with time zone,
    revoked_at timestamp with time zone,
    revision bigint DEFAULT 1 NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT keys_rpm_check CHECK ((rpm > 0)),
    CONSTRAINT keys_tpm_check CHECK ((tpm > 0)),
    CONSTRAINT keys_usd_micros_per_day_check CHECK ((usd_micros_per_day >= 0)),
    CONSTRAINT keys_usd_micros_per_month_check CHECK ((usd_micros_per_month >= 0))
);


--
-- Name: lease_dataplanes; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.lease_dataplanes (
    id text NOT NULL,
    token_name text NOT NULL,
    build text DEFAULT ''::text NOT NULL,
    api_versions text[] DEFAULT '{}'::text[] NOT NULL,
    frame text NOT NULL,
    boot text NOT NULL,
    seq bigint NOT NULL,
    applied_generation bigint,
    rejections jsonb DEFAULT '[]'::jsonb NOT NULL,
    heartbeat_ms bigint,
    first_heartbeat timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    last_heartbeat timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    heartbeats bigint DEFAULT 0 NOT NULL
);


--
-- Name: lease_grants; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.lease_grants (
    account text NOT NULL,
    dataplane text NOT NULL,
    rule_uid text,
    frame text NOT NULL,
    committed bigint DEFAULT 0 NOT NULL,
    liability bigint DEFAULT 0 NOT NULL,
    reserved bigint DEFAULT 0 NOT NULL,
    allowance bigint DEFAULT 0 NOT NULL,
    prior_committed bigint DEFAULT 0 NOT NULL,
    prior_unobserved bigint DEFAULT 0 NOT NULL,
    adoptions bigint DEFAULT 0 NOT NULL,
    renew_ms bigint NOT NULL,
    expires_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT lease_grants_allowance_check CHECK ((allowance >= 0)),
    CONSTRAINT lease_grants_committed_check CHECK ((committed >= 0)),
    CONSTRAINT lease_grants_liability_check CHECK ((liability >= 0)),
    CONSTRAINT lease_grants_reserved_check CHECK ((reserved >= 0))
);


--
-- Name: permit_segments; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.permit_segments (
    permit_id uuid NOT NULL,
    counter text NOT NULL,
    kind text NOT NULL,
    dimension text NOT NULL,
    amount bigint NOT NULL,
    "limit" bigint,
    "window" text,
    rule_uid text,
    hard boolean DEFAULT true NOT NULL,
    committed bigint,
    liability bigint,
    CONSTRAINT permit_segments_kind_check CHECK ((kind = ANY (ARRAY['bucket'::text, 'window'::text, 'account'::text])))
);


--
-- Name: policy_changes; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.policy_changes (
    id bigint NOT NULL,
    generation bigint NOT NULL,
    name text NOT NULL,
    action text NOT NULL,
    author text NOT NULL,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    before jsonb,
    after jsonb,
    CONSTRAINT policy_changes_action_check CHECK ((action = ANY (ARRAY['put'::text, 'delete'::text])))
);


--
-- Name: policy_changes_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.policy_changes_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: policy_changes_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.policy_changes_id_seq OWNED BY public.policy_changes.id;


--
-- Name: policy_generations; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.policy_generations (
    generation bigint NOT NULL,
    fingerprint text NOT NULL,
    documents jsonb NOT NULL,
    author text NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);


--
-- Name: policy_state; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.policy_state (
    singleton boolean DEFAULT true NOT NULL,
    generation bigint DEFAULT 0 NOT NULL,
    fingerprint text DEFAULT ''::text NOT NULL,
    CONSTRAINT policy_state_singleton_check CHECK (singleton)
);


--
-- Name: teams; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.teams (
    id text NOT NULL,
    name text NOT NULL,
    rpm bigint,
    tpm bigint,
    tokens_per_day bigint,
    usd_micros_per_day bigint,
    usd_micros_per_month bigint,
    region text,
    guardrails text[] DEFAULT '{}'::text[] NOT NULL,
    revision bigint DEFAULT 1 NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    budget_fit_floor bigint,
    CONSTRAINT teams_budget_fit_floor_check CHECK ((budget_fit_floor >= 0)),
    CONSTRAINT teams_rpm_check CHECK ((rpm > 0)),
    CONSTRAINT teams_tokens_per_day_check CHECK ((tokens_per_day >= 0)),
    CONSTRAINT teams_tpm_check CHECK ((tpm > 0)),
    CONSTRAINT teams_usd_micros_per_day_check CHECK ((usd_micros_per_day >= 0)),
    CONSTRAINT teams_usd_micros_per_month_check CHECK ((usd_micros_per_month >= 0))
);


--
-- Name: policy_changes id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.policy_changes ALTER COLUMN id SET DEFAULT nextval('public.policy_changes_id_seq'::regclass);


--
-- Data for Name: alembic_version; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.alembic_version VALUES ('0009');


--
-- Data for Name: alert_events; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: authority_accounts; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.authority_accounts VALUES ('account:org:budget:2026-11', 'r-1', 'budget:2026-11', '2026-11', 1000000, true, 5000, 1234, 0, false, 5000);


--
-- Data for Name: authority_namespace; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.authority_namespace VALUES (true, '5562cbf0-c28f-44a4-9a5d-47d12f6cb777', '2026-12-04 15:07:08.667532+00');


--
-- Data for Name: bootstrap_declarations; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: counters; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.counters VALUES ('team:t1:tpm', 'bucket', 'tokens', 10000, 585570660000, 1796396828924742, NULL, 0, 0, false, 0);
INSERT INTO public.counters VALUES ('team:t1:usd:day:2026-11-30', 'window', 'usd', 100000, NULL, NULL, '2026-11-30', 5000, 1234, false, 5000);


--
-- Data for Name: keys; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.keys VALUES ('k1', 't1', 'h1', 'sk-inf-a', '', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, '2026-12-04 15:07:08.874087+00');


--
-- Data for Name: lease_dataplanes; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: lease_grants; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: permit_segments; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.permit_segments VALUES ('36189f56-775e-48e4-b036-98cceecc2344', 'team:t1:tpm', 'bucket', 'tokens', 100, 10000, NULL, NULL, true, NULL, NULL);
INSERT INTO public.permit_segments VALUES ('36189f56-775e-48e4-b036-98cceecc2344', 'team:t1:usd:day:2026-11-30', 'window', 'usd', 5000, 100000, '2026-11-30', NULL, true, NULL, NULL);
INSERT INTO public.permit_segments VALUES ('36189f56-775e-48e4-b036-98cceecc2344', 'account:org:budget:2026-11', 'account', 'usd', 5000, 1000000, '2026-11', 'r-1', true, NULL, NULL);
INSERT INTO public.permit_segments VALUES ('e92ca3da-4e6c-4f2c-831e-a8c7486841a1', 'team:t1:tpm', 'bucket', 'tokens', 100, 10000, NULL, NULL, true, 40, 0);
INSERT INTO public.permit_segments VALUES ('e92ca3da-4e6c-4f2c-831e-a8c7486841a1', 'team:t1:usd:day:2026-11-30', 'window', 'usd', 5000, 100000, '2026-11-30', NULL, true, 1234, 0);
INSERT INTO public.permit_segments VALUES ('e92ca3da-4e6c-4f2c-831e-a8c7486841a1', 'account:org:budget:2026-11', 'account', 'usd', 5000, 1000000, '2026-11', 'r-1', true, 1234, 0);
INSERT INTO public.permit_segments VALUES ('c09bce1d-0208-4126-9294-4333bd374742', 'team:t1:tpm', 'bucket', 'tokens', 100, 10000, NULL, NULL, true, 100, 0);
INSERT INTO public.permit_segments VALUES ('c09bce1d-0208-4126-9294-4333bd374742', 'team:t1:usd:day:2026-11-30', 'window', 'usd', 5000, 100000, '2026-11-30', NULL, true, 0, 5000);
INSERT INTO public.permit_segments VALUES ('c09bce1d-0208-4126-9294-4333bd374742', 'account:org:budget:2026-11', 'account', 'usd', 5000, 1000000, '2026-11', 'r-1', true, 0, 5000);


--
-- Data for Name: permits; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.permits VALUES ('36189f56-775e-48e4-b036-98cceecc2344', 'open', 'k1', 't1', 'ci', 'm', 100, 5000, 0, '2026-11-30', '2026-11', 'pending', NULL, NULL, NULL, NULL, 1796396828901628, '2026-12-04 15:07:08.902819+00', NULL, NULL, NULL, false, NULL);
INSERT INTO public.permits VALUES ('e92ca3da-4e6c-4f2c-831e-a8c7486841a1', 'done', 'k1', 't1', 'ci', 'm', 100, 5000, 0, '2026-11-30', '2026-11', 'complete', '3589dac368ba6f042720248804b21f5972c3e93516eff2fba1f57573da1f1eb4', '', 40, 1234, 1796396828901628, '2026-12-04 15:07:08.902225+00', '2026-12-04 15:07:08.918261+00', 0, 0, false, NULL);
INSERT INTO public.permits VALUES ('c09bce1d-0208-4126-9294-4333bd374742', 'cut', 'k1', 't1', 'ci', 'm', 100, 5000, 0, '2026-11-30', '2026-11', 'uncertain', '1026bdb0e8dd209662741bd6e385f4084a4ba84d3ab4dc22ad72888304feb4a7', 'cut', 0, 0, 1796396828901628, '2026-12-04 15:07:08.902802+00', '2026-12-04 15:07:08.924497+00', 100, 5000, false, NULL);


--
-- Data for Name: policy_changes; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: policy_generations; Type: TABLE DATA; Schema: public; Owner: -
--



--
-- Data for Name: policy_state; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.policy_state VALUES (true, 0, '');


--
-- Data for Name: teams; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.teams VALUES ('t1', 'one', NULL, NULL, NULL, NULL, NULL, NULL, '{}', 1, '2026-12-04 15:07:08.872048+00', '2026-12-04 15:07:08.872048+00', NULL);


--
-- Name: policy_changes_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.policy_changes_id_seq', 1, false);


--
-- Name: alembic_version alembic_version_pkc; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.alembic_version
    ADD CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num);


--
-- Name: alert_events alert_events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.alert_events
    ADD CONSTRAINT alert_events_pkey PRIMARY KEY (counter, "window", threshold);


--
-- Name: authority_accounts authority_accounts_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.authority_accounts
    ADD CONSTRAINT authority_accounts_pkey PRIMARY KEY (key);


--
-- Name: authority_namespace authority_namespace_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.authority_namespace
    ADD CONSTRAINT authority_namespace_pkey PRIMARY KEY (singleton);


--
-- Name: bootstrap_declarations bootstrap_declarations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.bootstrap_declarations
    ADD CONSTRAINT bootstrap_declarations_pkey PRIMARY KEY (kind, name);


--
-- Name: counters counters_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.counters
    ADD CONSTRAINT counters_pkey PRIMARY KEY (key);


--
-- Name: keys keys_key_hash_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.keys
    ADD CONSTRAINT keys_key_hash_key UNIQUE (key_hash);


--
-- Name: keys keys_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.keys
    ADD CONSTRAINT keys_pkey PRIMARY KEY (id);


--
-- Name: lease_dataplanes lease_dataplanes_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.lease_dataplanes
    ADD CONSTRAINT lease_dataplanes_pkey PRIMARY KEY (id);


--
-- Name: lease_grants lease_grants_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.lease_grants
    ADD CONSTRAINT lease_grants_pkey PRIMARY KEY (account, dataplane);


--
-- Name: permit_segments permit_segments_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.permit_segments
    ADD CONSTRAINT permit_segments_pkey PRIMARY KEY (permit_id, counter);


--
-- Name: permits permits_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.permits
    ADD CONSTRAINT permits_pkey PRIMARY KEY (id);


--
-- Name: policy_changes policy_changes_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.policy_changes
    ADD CONSTRAINT policy_changes_pkey PRIMARY KEY (id);


--
-- Name: policy_generations policy_generations_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.policy_generations
    ADD CONSTRAINT policy_generations_pkey PRIMARY KEY (generation);


--
-- Name: policy_state policy_state_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.policy_state
    ADD CONSTRAINT policy_state_pkey PRIMARY KEY (singleton);


--
-- Name: teams teams_name_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.teams
    ADD CONSTRAINT teams_name_key UNIQUE (name);


--
-- Name: teams teams_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.teams
    ADD CONSTRAINT teams_pkey PRIMARY KEY (id);


--
-- Name: authority_accounts_frozen_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX authority_accounts_frozen_idx ON public.authority_accounts USING btree (key) WHERE frozen;


--
-- Name: authority_accounts_window_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX authority_accounts_window_idx ON public.authority_accounts USING btree (window_period);


--
-- Name: counters_frozen_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX counters_frozen_idx ON public.counters USING btree (key) WHERE frozen;


--
-- Name: counters_usd_window_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX counters_usd_window_idx ON public.counters USING btree ("window") WHERE ((kind = 'window'::text) AND (dimension = 'usd'::text));


--
-- Name: keys_team_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX keys_team_idx ON public.keys USING btree (team_id);


--
-- Name: lease_grants_dataplane_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX lease_grants_dataplane_idx ON public.lease_grants USING btree (dataplane);


--
-- Name: permits_key_month_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX permits_key_month_idx ON public.permits USING btree (key_id, month);


--
-- Name: permits_pending_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX permits_pending_idx ON public.permits USING btree (created_at) WHERE (status = 'pending'::text);


--
-- Name: permits_team_month_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX permits_team_month_idx ON public.permits USING btree (team_id, month);


--
-- Name: policy_changes_generation_idx; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX policy_changes_generation_idx ON public.policy_changes USING btree (generation);


--
-- Name: keys keys_team_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.keys
    ADD CONSTRAINT keys_team_id_fkey FOREIGN KEY (team_id) REFERENCES public.teams(id);


--
-- Name: lease_grants lease_grants_account_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.lease_grants
    ADD CONSTRAINT lease_grants_account_fkey FOREIGN KEY (account) REFERENCES public.authority_accounts(key);


--
-- Name: lease_grants lease_grants_dataplane_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.lease_grants
    ADD CONSTRAINT lease_grants_dataplane_fkey FOREIGN KEY (dataplane) REFERENCES public.lease_dataplanes(id);


--
-- Name: permit_segments permit_segments_permit_id_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.permit_segments
    ADD CONSTRAINT permit_segments_permit_id_fkey FOREIGN KEY (permit_id) REFERENCES public.permits(id);


--
-- Name: policy_changes policy_changes_generation_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.policy_changes
    ADD CONSTRAINT policy_changes_generation_fkey FOREIGN KEY (generation) REFERENCES public.policy_generations(generation);


--
-- PostgreSQL database dump complete
--


