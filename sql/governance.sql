-- inferplane's governance engine: admission and settlement in Postgres (ADR-046,
-- DESIGN §4-§5): the present definitions, installed after sql/schema.sql (sql.SCHEMA).
--
-- The gateway plans in Python (which counters a request charges, for how much, in which
-- captured window) and calls ONE of these functions per admission or settlement, so each
-- is one round trip and one transaction under READ COMMITTED with explicit row locks.
-- Every function takes part in one global lock order, so no two of them deadlock:
--   keys, teams FOR SHARE (sorted), policy_state FOR SHARE, permits by id, then the
--   accounts and then the counters, each in byte order (COLLATE "C"; every "account:"
--   key sorts before every counter key).
--
-- Entry points (sql/queries.sql names the calls):
--   inferplane_admit_one_v2      one admission (the store's lone call)
--   inferplane_admit_v2          a coalesced batch of admissions, decided set-based
--   inferplane_admit_serial_v1   requests admitted one after another: the general path
--                                (a counter charged twice) and what a batch must equal
--   inferplane_settle_one_v2     one settlement (the store's lone call)
--   inferplane_settle_v2         a coalesced batch of settlements, decided set-based
--   inferplane_settle_permit_v1  one permit, the general path (used by resolve)
--   inferplane_resolve_v2        a later exact figure replaces a permit's liability
--   inferplane_settle_admit_v2   settlements, then admissions, in one transaction
-- The settling entry points also write the request log's facts
-- (inferplane_write_facts_v2) once their permits are locked.
-- A batch answers request by request exactly as the serial path would in batch order
-- (docs/batching.md says why; tests/integration/test_pg_batch_equivalence.py checks
-- answers and every row).
--
-- Answers are jsonb facts, never HTTP statuses: a permit {"permit_id", "buckets"}, or a
-- refusal {"reason" (its code), "counter", and the figures the counter held}; a
-- settlement's figures, or {"conflict"}, {"unknown"}, {"bad_commits", "problem"}. The
-- gateway words and maps them in one table (gateway/governance/_refusal.py).
--
-- Entry points run with enable_seqscan and jit off and generic plans
-- (plan_cache_mode = force_generic_plan): a connection plans each statement once, and
-- the plans it caches while the tables are small stay index plans as they grow.
-- Batch entry points also run without parallel workers: their aggregates read one sorted
-- input and must see its rows in order.
--
-- Money and tokens are integer µUSD / tokens; bucket balances are in 1/60_000_000 token
-- (gateway.governance.BUCKET_SCALE), refilled from database time in whole µs.

-- == Arithmetic shared by admission and settlement =====================================

-- Database time in whole µs since the epoch (extract returns numeric: exact).
CREATE FUNCTION inferplane_now_us_v1() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
$$;

-- Exact bucket refill (gateway.governance.refill): numeric intermediates, because
-- capacity * elapsed overflows bigint after a long idle period.
CREATE FUNCTION inferplane_refill_v1(balance bigint, capacity bigint, elapsed_us bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN elapsed_us <= 0 THEN balance
                ELSE least(capacity::numeric * 60000000,
                           balance::numeric + capacity::numeric * elapsed_us)::bigint END
$$;

-- Whole seconds until a bucket can take amount (gateway.governance.retry_after_seconds).
CREATE FUNCTION inferplane_retry_after_v1(balance bigint, capacity bigint, amount bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN need <= 0 THEN 0
                ELSE greatest(1, ceil(ceil(need / capacity) / 1000000))::bigint END
    FROM (SELECT least(amount, capacity)::numeric * 60000000 - balance AS need) n
$$;

-- == Admission ========================================================================

-- Check the definitions a request was planned from; NULL if still current.
CREATE FUNCTION inferplane_check_snapshot_v1(req jsonb, current_generation bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    k record;
    team_revision bigint;
BEGIN
    SELECT * INTO k FROM keys WHERE id = req->>'key_id';
    IF NOT FOUND OR k.revoked_at IS NOT NULL
       OR (k.expires_at IS NOT NULL AND k.expires_at <= clock_timestamp())
       OR k.revision <> (req->>'key_revision')::bigint
       OR k.team_id <> req->>'team_id' THEN
        RETURN jsonb_build_object('reason', 'snapshot_mismatch',
                                  'counter', 'key:' || (req->>'key_id'));
    END IF;
    SELECT revision INTO team_revision FROM teams WHERE id = req->>'team_id';
    IF team_revision IS DISTINCT FROM (req->>'team_revision')::bigint THEN
        RETURN jsonb_build_object('reason', 'snapshot_mismatch',
                                  'counter', 'team:' || (req->>'team_id'));
    END IF;
    IF current_generation <> (req->>'policy_generation')::bigint THEN
        RETURN jsonb_build_object('reason', 'snapshot_mismatch',
                                  'counter', 'policy');
    END IF;
    RETURN NULL;
END
$$;

-- Lock (creating if missing) one counter or account row named by a charge. The common
-- case (the row exists) is a plain SELECT ... FOR UPDATE, which writes no new row
-- version; a missing row is inserted (ON CONFLICT: a concurrent creator wins) and locked.
CREATE FUNCTION inferplane_lock_charge_v1(ch jsonb, now_us bigint)
RETURNS void LANGUAGE plpgsql AS $$
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
        VALUES (v_key, v_uid, ch->>'scope', ch->>'window', (ch->>'limit')::bigint, coalesce((ch->>'hard')::boolean, true))
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
$$;

-- Would this (locked) charge fit? NULL if yes, else the refusal with its figures.
CREATE FUNCTION inferplane_check_charge_v1(ch jsonb, now_us bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
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
            RETURN jsonb_build_object('reason', 'rate_limited', 'counter', v_key,
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
        RETURN jsonb_build_object('reason', 'account_frozen', 'counter', v_key);
    END IF;
    IF hard AND cap IS NOT NULL
       AND a.committed + a.liability + a.reserved + a.leased + amount > cap THEN
        RETURN jsonb_build_object('reason', CASE WHEN money THEN 'budget_exhausted'
                                                 WHEN ch->>'dimension' = 'requests'
                                                 THEN 'concurrency_limited'
                                                 ELSE 'token_quota_exhausted' END,
            'counter', v_key, 'limit', cap, 'committed', a.committed,
            'liability', a.liability, 'reserved', a.reserved, 'leased', a.leased,
            'amount', amount, 'window', ch->>'window', 'dimension', ch->>'dimension');
    END IF;
    RETURN NULL;
END
$$;

-- Reserve one (locked, checked) charge.
CREATE FUNCTION inferplane_reserve_charge_v1(ch jsonb, now_us bigint)
RETURNS void LANGUAGE plpgsql AS $$
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

-- Write a granted permit and every segment it charged (with its captured window/limit).
CREATE FUNCTION inferplane_write_permit_v1(req jsonb, now_us bigint) RETURNS uuid
LANGUAGE plpgsql AS $$
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

-- Admit a JSON array of gateway.governance.AdmissionRequest one request after another,
-- in one transaction: each request's definitions checked (inferplane_check_snapshot_v1),
-- its rows locked in byte order (creating missing windows), every charge checked, then
-- all reserved (all or none) and the permit written. One answer per request, in order:
-- {"permit_id", "buckets": {counter: balance right after the reservation}} or a
-- refusal with the figures the refusing counter held. A hard window or account refuses
-- when committed + liability + reserved (+ leased) + amount would pass its limit:
-- liability binds like a reservation (DESIGN §5).
CREATE FUNCTION inferplane_admit_serial_v1(requests jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
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

-- One request's definitions locked in the fixed order (keys, teams, policy generation,
-- each FOR SHARE) and its snapshot checked with inferplane_check_snapshot_v1's
-- conditions: NULL if still current, else the snapshot_mismatch refusal.
CREATE FUNCTION inferplane_snapshot_one_v2(req jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    k keys;
    team_rev bigint;
    cur_gen bigint;
BEGIN
    SELECT * INTO k FROM keys WHERE id = req->>'key_id' FOR SHARE;
    SELECT revision INTO team_rev FROM teams WHERE id = req->>'team_id' FOR SHARE;
    SELECT ps.generation INTO cur_gen FROM policy_state ps FOR SHARE;
    IF k.id IS NULL OR k.revoked_at IS NOT NULL
       OR (k.expires_at IS NOT NULL AND k.expires_at <= clock_timestamp())
       OR k.revision <> (req->>'key_revision')::bigint
       OR k.team_id <> req->>'team_id' THEN
        RETURN jsonb_build_object('reason', 'snapshot_mismatch',
                                  'counter', 'key:' || (req->>'key_id'));
    END IF;
    IF team_rev IS DISTINCT FROM (req->>'team_revision')::bigint THEN
        RETURN jsonb_build_object('reason', 'snapshot_mismatch',
                                  'counter', 'team:' || (req->>'team_id'));
    END IF;
    IF cur_gen <> (req->>'policy_generation')::bigint THEN
        RETURN jsonb_build_object('reason', 'snapshot_mismatch', 'counter', 'policy');
    END IF;
    RETURN NULL;
END
$$;

-- The rows one request charges, locked in the global order: if one is missing (a new
-- window, team or key), the row-by-row path in byte order (lock, else insert and lock);
-- else the accounts (only when p_accounts: it charges one), then the counters, each by
-- one sorted statement (every "account:" key sorts before every counter key). False,
-- with nothing locked, when a counter is charged twice (the serial path's case).
CREATE FUNCTION inferplane_lock_one_v2(req jsonb, p_accounts boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    n_missing int;
    n_repeated int;
    chj jsonb;
    now_us bigint;
BEGIN
    SELECT count(*) FILTER (WHERE NOT EXISTS (
                SELECT 1 FROM authority_accounts a WHERE x.kind = 'account' AND a.key = x.counter
                UNION ALL
                SELECT 1 FROM counters c WHERE x.kind <> 'account' AND c.key = x.counter)),
           count(*) - count(DISTINCT x.counter)
      INTO n_missing, n_repeated
      FROM jsonb_to_recordset(req->'charges') AS x(counter text, kind text);
    IF n_repeated > 0 THEN
        RETURN false;
    END IF;
    now_us := inferplane_now_us_v1();
    IF n_missing > 0 THEN
        FOR chj IN SELECT x FROM jsonb_array_elements(req->'charges') x
                    ORDER BY x->>'counter' COLLATE "C" LOOP
            PERFORM inferplane_lock_charge_v1(chj, now_us);
        END LOOP;
    ELSE
        IF p_accounts THEN
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
    RETURN true;
END
$$;

-- One request's (locked, checked) charges reserved as inferplane_reserve_charge_v1
-- does, by one statement per table (the accounts' only when p_accounts), and its permit
-- written (inferplane_write_permit_v1). Answers {"permit_id", "buckets": each charged
-- bucket's balance right after the reservation}.
CREATE FUNCTION inferplane_reserve_one_v2(req jsonb, now_us bigint, p_accounts boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    balances jsonb;
BEGIN
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
    SELECT coalesce(jsonb_object_agg(u.key, u.balance) FILTER (WHERE u.bucket), '{}'::jsonb)
      INTO balances FROM u;
    IF p_accounts THEN
        UPDATE authority_accounts a
           SET reserved = a.reserved + x.amount, "limit" = x."limit",
               hard = coalesce(x.hard, true)
          FROM jsonb_to_recordset(req->'charges')
               AS x(counter text, kind text, amount bigint, "limit" bigint, hard boolean)
         WHERE x.kind = 'account' AND a.key = x.counter;
    END IF;
    RETURN jsonb_build_object('permit_id', inferplane_write_permit_v1(req, now_us),
                              'buckets', balances);
END
$$;

-- One admission (an array of exactly one request, else the serial path), in as few
-- statements as it can: the definitions checked (inferplane_snapshot_one_v2), the rows
-- locked (inferplane_lock_one_v2; a counter charged twice: the serial path), every
-- charge checked in order against the rows read by one statement (the conditions of
-- inferplane_check_charge_v1), then all reserved and the permit written
-- (inferplane_reserve_one_v2). Answers as inferplane_admit_serial_v1 does.
CREATE FUNCTION inferplane_admit_one_v2(p_requests jsonb) RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    req jsonb := p_requests->0;
    now_us bigint;
    ch record;
    bal bigint;
    refusal jsonb;
    -- Whether it charges an account (a policy budget): if not, no account statement runs.
    v_accounts boolean := jsonb_path_exists(req->'charges', '$[*] ? (@.kind == "account")');
BEGIN
    IF jsonb_array_length(p_requests) <> 1 THEN  -- the store sends one; any other: serial
        RETURN inferplane_admit_serial_v1(p_requests);
    END IF;
    refusal := inferplane_snapshot_one_v2(req);
    IF refusal IS NOT NULL THEN
        RETURN jsonb_build_array(refusal);
    END IF;
    IF NOT inferplane_lock_one_v2(req, v_accounts) THEN
        RETURN inferplane_admit_serial_v1(p_requests);
    END IF;
    now_us := inferplane_now_us_v1();

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
                    'reason', 'rate_limited', 'counter', ch.counter,
                    'retry_after', inferplane_retry_after_v1(bal, ch.cap, ch.amount),
                    'limit', ch.cap, 'amount', ch.amount, 'dimension', ch.dimension);
            END IF;
        ELSIF ch.frozen THEN
            refusal := jsonb_build_object('reason', 'account_frozen',
                                          'counter', ch.counter);
        ELSIF ch.hard AND ch.cap IS NOT NULL
              AND ch.committed + ch.liability + ch.reserved + ch.leased + ch.amount > ch.cap THEN
            refusal := jsonb_build_object(
                'reason', CASE WHEN ch.dimension = 'usd' THEN 'budget_exhausted'
                               WHEN ch.dimension = 'requests' THEN 'concurrency_limited'
                               ELSE 'token_quota_exhausted' END,
                'counter', ch.counter, 'limit', ch.cap, 'committed', ch.committed,
                'liability', ch.liability, 'reserved', ch.reserved, 'leased', ch.leased,
                'amount', ch.amount, 'window', ch."window", 'dimension', ch.dimension);
        END IF;
        IF refusal IS NOT NULL THEN
            RETURN jsonb_build_array(refusal);
        END IF;
    END LOOP;
    RETURN jsonb_build_array(inferplane_reserve_one_v2(req, now_us, v_accounts));
END
$$;

-- The definitions a batch was planned from, locked in the fixed order (keys, teams FOR
-- SHARE; policy_state FOR SHARE), and each request's snapshot checked with
-- inferplane_check_snapshot_v1's conditions in one join: NULL where still current, else
-- the snapshot_mismatch refusal naming what changed. One element per request.
CREATE FUNCTION inferplane_snapshot_v1(p_requests jsonb) RETURNS jsonb[]
LANGUAGE plpgsql AS $$
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
               THEN jsonb_build_object('reason', 'snapshot_mismatch',
                                       'counter', 'key:' || q.key_id)
               WHEN t.revision IS DISTINCT FROM q.team_revision
               THEN jsonb_build_object('reason', 'snapshot_mismatch',
                                       'counter', 'team:' || q.team_id)
               WHEN cur_gen <> q.policy_generation
               THEN jsonb_build_object('reason', 'snapshot_mismatch',
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

-- A batch's charges parsed once, in request then charge order (the aggregates read the
-- sorted rows in order): one element of each c_ array per charge, c_req its request's
-- position; r_first..r_last each request's charges (1..0 for a request without any).
CREATE FUNCTION inferplane_parse_charges_v2(
    p_requests jsonb, n int, OUT c_req int[], OUT c_counter text[], OUT c_kind text[],
    OUT c_dim text[], OUT c_amount bigint[], OUT c_limit bigint[], OUT c_window text[],
    OUT c_uid text[], OUT c_hard boolean[], OUT r_first int[], OUT r_last int[])
LANGUAGE plpgsql AS $$
DECLARE
    j int;
BEGIN
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
END
$$;

-- The permits (pid_of: NULL for a request not admissible) and their segments inserted,
-- admitted_us database time read here (see inferplane_admit_checked_v2).
CREATE FUNCTION inferplane_write_permits_v2(
    p_requests jsonb, pid_of uuid[], c_req int[], c_counter text[], c_kind text[],
    c_dim text[], c_amount bigint[], c_limit bigint[], c_window text[], c_uid text[],
    c_hard boolean[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    admitted_us bigint := inferplane_now_us_v1();
BEGIN
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
END
$$;

-- Every account and counter the still-admissible requests (results[req] NULL) charge,
-- each row locked, in byte order: if one is missing (a new window or team), the row-by-row
-- path for them all (inferplane_lock_charge_v1: lock, else insert and lock; ON CONFLICT a
-- concurrent creator wins), so a creation never inverts a lock order; then (or else)
-- the accounts and then the counters, each locked (or re-read under the locks already
-- held) by one sorted statement into the s_ arrays: the rows' figures, accounts first.
CREATE FUNCTION inferplane_lock_rows_v2(
    results jsonb[], c_req int[], c_counter text[], c_kind text[], c_dim text[],
    c_limit bigint[], c_window text[], c_uid text[], c_hard boolean[],
    OUT s_key text[], OUT s_acct boolean[], OUT s_balance bigint[], OUT s_updated bigint[],
    OUT s_reserved bigint[], OUT s_committed bigint[], OUT s_liability bigint[],
    OUT s_leased bigint[], OUT s_frozen boolean[], OUT s_limit bigint[],
    OUT s_hard boolean[])
LANGUAGE plpgsql AS $$
DECLARE
    a_keys text[];
    k_keys text[];
    found_rows int;
    now_us bigint;
    ch jsonb;
BEGIN
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
END
$$;

-- The rows a batch of admissions changed (s_dirty), written by one UPDATE per table
-- (the accounts' only when p_accounts: an account was charged).
CREATE FUNCTION inferplane_write_rows_v2(
    s_key text[], s_acct boolean[], s_dirty boolean[], s_balance bigint[],
    s_updated bigint[], s_reserved bigint[], s_limit bigint[], s_hard boolean[],
    p_accounts boolean)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_accounts THEN
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
END
$$;

-- Each snapshot-current request of a batch (results[i] NULL) checked and reserved,
-- all or none, in batch order on the running state of its locked rows (the s_ arrays,
-- c_slot: each charge's row), so a later request sees the earlier ones' reservations:
-- a refusal (inferplane_check_charge_v1's conditions) becomes its answer and its
-- permit (pid_of) is listed in refused; a grant answers {"permit_id", "buckets"} and
-- marks the rows it changed in s_dirty (accounts_dirty: an account among them).
CREATE FUNCTION inferplane_decide_v2(
    n int, now_us bigint, pid_of uuid[], r_first int[], r_last int[], c_slot int[],
    c_counter text[], c_kind text[], c_dim text[], c_amount bigint[], c_limit bigint[],
    c_window text[], c_hard boolean[], s_committed bigint[], s_liability bigint[],
    s_leased bigint[], s_frozen boolean[], INOUT results jsonb[],
    INOUT s_balance bigint[], INOUT s_updated bigint[], INOUT s_reserved bigint[],
    INOUT s_limit bigint[], INOUT s_hard boolean[], INOUT s_dirty boolean[],
    OUT refused uuid[], OUT granted int, OUT accounts_dirty boolean)
LANGUAGE plpgsql AS $$
DECLARE
    i int;
    j int;
    k int;
    amount bigint;
    cap bigint;
    bal bigint;
    refusal jsonb;
    balances jsonb;
BEGIN
    refused := '{}';
    granted := 0;
    accounts_dirty := false;
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
                    refusal := jsonb_build_object(
                        'reason', 'rate_limited', 'counter', c_counter[j],
                        'retry_after', inferplane_retry_after_v1(bal, cap, amount),
                        'limit', cap, 'amount', amount, 'dimension', c_dim[j]);
                    EXIT;
                END IF;
            ELSIF s_frozen[k] THEN
                refusal := jsonb_build_object('reason', 'account_frozen',
                                              'counter', c_counter[j]);
                EXIT;
            ELSIF c_hard[j] AND cap IS NOT NULL
                  AND s_committed[k] + s_liability[k] + s_reserved[k] + s_leased[k]
                      + amount > cap THEN
                refusal := jsonb_build_object(
                    'reason', CASE WHEN c_dim[j] = 'usd' THEN 'budget_exhausted'
                                   WHEN c_dim[j] = 'requests' THEN 'concurrency_limited'
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
END
$$;

-- A batch of admissions whose snapshots were checked (p_snapshot: NULL where current),
-- decided set-based. The answers equal inferplane_admit_serial_v1's on the same batch in
-- the same order; what differs is the work done while a hot team's rows are locked:
--   1. the requests and their charges parsed once into arrays
--      (inferplane_parse_charges_v2);
--   2. every snapshot-current request's permit and segment rows inserted BEFORE any
--      account or counter is locked (inferplane_write_permits_v2: new rows no other
--      transaction can see, so no lock order edge), with admitted_us read there (a
--      settlement's true-up reduces a credit by the refill since admitted_us: an earlier
--      instant credits less, never more);
--   3. the batch's accounts, then its counters, locked in byte order into arrays
--      (inferplane_lock_rows_v2, creating a missing row on the row-by-row path);
--   4. each request checked and reserved on the running in-memory state, in batch order
--      (inferplane_decide_v2); a refused request's segments and permit are deleted
--      again in the same transaction;
--   5. one UPDATE per table for the rows the batch changed (inferplane_write_rows_v2).
CREATE FUNCTION inferplane_admit_checked_v2(p_requests jsonb, p_snapshot jsonb[])
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    n int := jsonb_array_length(p_requests);
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
    results jsonb[] := p_snapshot;
    pid_of uuid[];
    refused uuid[];
    granted int;
    accounts_dirty boolean;
    now_us bigint;
BEGIN
    IF n = 0 THEN
        RETURN '[]'::jsonb;
    END IF;
    SELECT * INTO c_req, c_counter, c_kind, c_dim, c_amount, c_limit, c_window, c_uid,
                  c_hard, r_first, r_last
      FROM inferplane_parse_charges_v2(p_requests, n);
    SELECT array_agg(CASE WHEN results[i] IS NULL THEN gen_random_uuid() END ORDER BY i)
      INTO pid_of FROM generate_series(1, n) i;
    IF cardinality(array_remove(pid_of, NULL)) = 0 THEN
        RETURN to_jsonb(results);
    END IF;
    PERFORM inferplane_write_permits_v2(p_requests, pid_of, c_req, c_counter, c_kind,
                                        c_dim, c_amount, c_limit, c_window, c_uid, c_hard);
    SELECT * INTO s_key, s_acct, s_balance, s_updated, s_reserved, s_committed,
                  s_liability, s_leased, s_frozen, s_limit, s_hard
      FROM inferplane_lock_rows_v2(results, c_req, c_counter, c_kind, c_dim, c_limit,
                                   c_window, c_uid, c_hard);
    SELECT coalesce(array_agg(array_position(s_key, x.k) ORDER BY x.o), '{}') INTO c_slot
      FROM unnest(c_counter) WITH ORDINALITY AS x(k, o);
    s_dirty := array_fill(false, ARRAY[cardinality(s_key)]);
    -- Database time read with every lock held (see inferplane_admit_v2).
    now_us := inferplane_now_us_v1();
    SELECT * INTO results, s_balance, s_updated, s_reserved, s_limit, s_hard, s_dirty,
                  refused, granted, accounts_dirty
      FROM inferplane_decide_v2(n, now_us, pid_of, r_first, r_last, c_slot, c_counter,
                                c_kind, c_dim, c_amount, c_limit, c_window, c_hard,
                                s_committed, s_liability, s_leased, s_frozen, results,
                                s_balance, s_updated, s_reserved, s_limit, s_hard, s_dirty);
    IF cardinality(refused) > 0 THEN
        DELETE FROM permit_segments WHERE permit_id = ANY(refused);
        DELETE FROM permits WHERE id = ANY(refused);
    END IF;
    IF granted > 0 THEN
        PERFORM inferplane_write_rows_v2(s_key, s_acct, s_dirty, s_balance, s_updated,
                                         s_reserved, s_limit, s_hard, accounts_dirty);
    END IF;
    RETURN to_jsonb(results);
END
$$;

-- A coalesced batch of admissions: snapshots checked, then decided set-based
-- (inferplane_admit_checked_v2). One answer per request, in order.
CREATE FUNCTION inferplane_admit_v2(p_requests jsonb) RETURNS jsonb
LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan
SET max_parallel_workers_per_gather = 0 AS $$
BEGIN
    IF jsonb_array_length(p_requests) = 0 THEN
        RETURN '[]'::jsonb;
    END IF;
    RETURN inferplane_admit_checked_v2(p_requests, inferplane_snapshot_v1(p_requests));
END
$$;

-- == Settlement =======================================================================

-- The permit's counters named in p_settlement that it did not charge, or that it
-- charged and p_settlement does not commit: NULL when they match.
CREATE FUNCTION inferplane_check_parts_v1(p_permit uuid, p_settlement jsonb)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
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

-- Lock the counters and accounts a permit charged, in the global order.
CREATE FUNCTION inferplane_lock_segments_v1(p_permit uuid)
RETURNS void LANGUAGE plpgsql AS $$
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

-- A settled permit's answer: its kind and three figures, and whether this call replayed it.
CREATE FUNCTION inferplane_settle_result_v1(p permits, p_replay boolean)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('permit_id', p.id, 'kind', p.status,
                              'tokens_committed', p.tokens_committed,
                              'usd_committed', p.usd_committed,
                              'tokens_liability', coalesce(p.tokens_liability, 0),
                              'usd_liability', coalesce(p.usd_liability, 0),
                              'bound_exceeded', p.bound_exceeded, 'replay', p_replay)
$$;

-- Record a permit's settlement (or a later resolution) and return the updated row.
CREATE FUNCTION inferplane_record_v1(p_permit uuid, p_settlement jsonb, p_resolution boolean)
RETURNS permits LANGUAGE sql AS $$
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

-- Settle one permit with the three figures (DESIGN §5, ADR-039). p_settlement is
-- gateway.governance.Settlement plus its fingerprint:
--   {"kind", "fingerprint", "detail", "tokens_committed", "usd_committed",
--    "tokens_liability", "usd_liability", "bound_exceeded",
--    "commits": {counter: amount}, "liabilities": {counter: amount}}
-- commits must name exactly the permit's counters (else {"bad_commits", "problem"},
-- nothing changed); liabilities only counters it charged. A window or account releases
-- its reservation, commits its part and adds its liability; a bucket is trued up to its
-- commit (crediting an over-estimate, reduced by the refill since admission; debiting
-- an under-estimate, possibly into debt). Invalid usage freezes the permit's money
-- windows and accounts, frees its in-flight slots and changes no other counter.
-- Returns {"permit_id", "kind",
-- "tokens_committed", "usd_committed", "tokens_liability", "usd_liability",
-- "bound_exceeded", "replay"}; an exact replay answers the same with "replay": true; a
-- different second settlement {"conflict": true, "kind"}; a permit never admitted
-- {"unknown": true}.
CREATE FUNCTION inferplane_settle_permit_v1(p_permit uuid, p_settlement jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
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
            RETURN inferplane_settle_result_v1(p, true);
        END IF;
        RETURN jsonb_build_object('conflict', true, 'kind', p.status);
    END IF;
    IF v_kind <> 'invalid' THEN
        v_bad := inferplane_check_parts_v1(p_permit, p_settlement);
        IF v_bad IS NOT NULL THEN
            RETURN v_bad;
        END IF;
    END IF;

    PERFORM inferplane_lock_segments_v1(p_permit);
    now_us := inferplane_now_us_v1();

    IF v_kind = 'invalid' THEN
        -- Freeze every money window/account the permit charged and change no other
        -- counter, except that its in-flight slots (requests windows) are freed.
        UPDATE counters SET frozen = true
         WHERE key IN (SELECT counter FROM permit_segments
                        WHERE permit_id = p_permit AND kind = 'window' AND dimension = 'usd');
        UPDATE counters c SET reserved = c.reserved - g.amount
          FROM permit_segments g
         WHERE g.permit_id = p_permit AND g.kind = 'window' AND g.dimension = 'requests'
           AND c.key = g.counter;
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

    RETURN inferplane_settle_result_v1(inferplane_record_v1(p_permit, p_settlement, false),
                                       false);
END
$$;

-- A settled permit's answer: its kind and three figures, and whether this call replayed
-- it (inferplane_settle_result_v1's, from the figures rather than the row). STABLE, as
-- jsonb_build_object is: the planner then inlines it into its callers' expressions.
CREATE FUNCTION inferplane_answer_v2(p_id uuid, p_kind text, p_tc bigint, p_uc bigint,
                                     p_tl bigint, p_ul bigint, p_be boolean,
                                     p_replay boolean)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('permit_id', p_id, 'kind', p_kind, 'tokens_committed', p_tc,
                              'usd_committed', p_uc, 'tokens_liability', coalesce(p_tl, 0),
                              'usd_liability', coalesce(p_ul, 0), 'bound_exceeded', p_be,
                              'replay', p_replay)
$$;

-- The request log's facts beyond a permit (permit_facts, one row per permit; the first
-- written stays), written by the settlement's own call with its permits locked: the
-- one insert into the request log.
CREATE FUNCTION inferplane_write_facts_v2(p_facts jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- plpgsql, not sql: its statement's plan is kept for the session.
    INSERT INTO permit_facts
    SELECT * FROM jsonb_to_recordset(p_facts) AS x(
        permit_id uuid, route text, deployment text, client text, http_status integer,
        input bigint, output bigint, cache_read bigint, cache_write_5m bigint,
        cache_write_1h bigint, cache_write_unknown bigint)
    ON CONFLICT (permit_id) DO NOTHING;
END
$$;

-- A settlement's commits checked against the counters its permit charged (p_counters,
-- in byte order): NULL when they match, else the first counter charged and not
-- committed, or the first named and not charged (in byte order), as
-- inferplane_check_parts_v1 answers. p_nkeys (how many distinct counters commits and
-- liabilities name, or NULL) skips the second search when it cannot find anything.
CREATE FUNCTION inferplane_check_commits_v2(p_commits jsonb, p_liabilities jsonb,
                                            p_counters text[], p_nkeys int)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_bad text;
    i int;
BEGIN
    FOR i IN 1..coalesce(cardinality(p_counters), 0) LOOP
        IF (p_commits -> p_counters[i]) IS NULL THEN
            RETURN jsonb_build_object('bad_commits', p_counters[i],
                                      'problem', 'missing for a charged counter');
        END IF;
    END LOOP;
    IF p_nkeys <= coalesce(cardinality(p_counters), 0) THEN
        RETURN NULL;
    END IF;
    SELECT ks.k INTO v_bad
      FROM (SELECT jsonb_object_keys(p_commits) k
            UNION SELECT jsonb_object_keys(coalesce(p_liabilities, '{}'))) ks
     WHERE ks.k <> ALL (coalesce(p_counters, '{}'))
     ORDER BY ks.k COLLATE "C" LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RETURN jsonb_build_object('bad_commits', v_bad,
                                  'problem', 'this permit did not charge that counter');
    END IF;
    RETURN NULL;
END
$$;

-- One settled permit's counters and accounts (locked by the caller) changed as
-- inferplane_settle_permit_v1 does, set-based: an invalid settlement freezes every money
-- window and account the permit charged and frees its in-flight slots (requests
-- windows), changing nothing else; any other trues its buckets up (a credit reduced by
-- the refill the reservation's lifetime could add; a debit into debt) and releases and
-- commits its windows and accounts (p_accounts: the account keys it charged).
CREATE FUNCTION inferplane_apply_one_v2(p_permit uuid, p_invalid boolean,
                                        p_admitted_us bigint, g_counter text[],
                                        g_kind text[], g_dim text[], p_accounts text[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := inferplane_now_us_v1();
BEGIN
    IF p_invalid THEN
        UPDATE counters SET frozen = true
         WHERE key IN (SELECT x.counter FROM unnest(g_counter, g_kind, g_dim)
                                             AS x(counter, kind, dim)
                        WHERE x.kind = 'window' AND x.dim = 'usd');
        IF 'requests' = ANY(g_dim) THEN
            UPDATE counters c SET reserved = c.reserved - s.amount
              FROM permit_segments s
             WHERE s.permit_id = p_permit AND s.kind = 'window'
               AND s.dimension = 'requests' AND c.key = s.counter;
        END IF;
        IF cardinality(p_accounts) > 0 THEN
            UPDATE authority_accounts SET frozen = true WHERE key = ANY(p_accounts);
        END IF;
        RETURN;
    END IF;
    UPDATE counters c
       SET balance = CASE WHEN s.kind <> 'bucket' THEN c.balance ELSE
               least(s."limit"::numeric * 60000000,
                     inferplane_refill_v1(c.balance, s."limit",
                                          now_us - c.updated_us)::numeric
                     + CASE WHEN s.amount > s.committed
                            THEN greatest(0, (s.amount - s.committed)::numeric
                                             * 60000000
                                             - s."limit"::numeric
                                             * greatest(0, now_us - p_admitted_us))
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
    IF cardinality(p_accounts) > 0 THEN
        UPDATE authority_accounts a
           SET reserved = a.reserved - s.amount, committed = a.committed + s.committed,
               liability = a.liability + s.liability
          FROM permit_segments s
         WHERE s.permit_id = p_permit AND s.kind = 'account' AND a.key = s.counter;
    END IF;
END
$$;

-- One settlement, answering as inferplane_settle_permit_v1 does, with the counter rows
-- held only for the counter arithmetic and the commit: the permit is locked first
-- (serialising every writer of its rows) and its facts written
-- (inferplane_write_facts_v2), its segments read once into arrays in byte order, the
-- commits checked against them (inferplane_check_commits_v2), the segments and the
-- permit row written, and only then the accounts (if it charged one) and the counters
-- locked, each by one statement, and updated (inferplane_apply_one_v2). A gateway
-- answers before it settles, so a client's next admission on the same team waits for
-- this settlement's locks: they are held for as little as possible.
CREATE FUNCTION inferplane_settle_one_v2(p_permit uuid, p_settlement jsonb, p_facts jsonb)
RETURNS jsonb LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    p permits;
    v_kind text := p_settlement->>'kind';
    v_bad jsonb;
    g_counter text[];
    g_kind text[];
    g_dim text[];
    v_accounts text[];
    v_counters text[];
BEGIN
    SELECT * INTO p FROM permits WHERE id = p_permit FOR UPDATE;
    PERFORM inferplane_write_facts_v2(p_facts);
    IF p.id IS NULL THEN
        RETURN jsonb_build_object('unknown', true);
    END IF;
    IF p.status <> 'pending' THEN
        IF p.settle_fingerprint = p_settlement->>'fingerprint' THEN
            RETURN inferplane_settle_result_v1(p, true);  -- a replay: rare, planned per call
        END IF;
        RETURN jsonb_build_object('conflict', true, 'kind', p.status);
    END IF;

    -- 1. The segments, in byte order (under the permit's lock nothing changes them).
    SELECT coalesce(array_agg(g.counter), '{}'), coalesce(array_agg(g.kind), '{}'),
           coalesce(array_agg(g.dimension), '{}')
      INTO g_counter, g_kind, g_dim
      FROM (SELECT s.counter, s.kind, s.dimension FROM permit_segments s
             WHERE s.permit_id = p_permit ORDER BY s.counter COLLATE "C") g;

    -- 2. The commits checked and written with the permit.
    IF v_kind <> 'invalid' THEN
        v_bad := inferplane_check_commits_v2(p_settlement->'commits',
                                             p_settlement->'liabilities', g_counter, NULL);
        IF v_bad IS NOT NULL THEN
            RETURN v_bad;
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

    -- 4. The counter arithmetic.
    PERFORM inferplane_apply_one_v2(p_permit, v_kind = 'invalid', p.admitted_us, g_counter,
                                    g_kind, g_dim, v_accounts);
    RETURN inferplane_answer_v2(p.id, p.status, p.tokens_committed, p.usd_committed,
                                p.tokens_liability, p.usd_liability, p.bound_exceeded,
                                false);
END
$$;

-- Apply settled permits' segments to their counters and accounts, in the order given
-- (one element of each array per segment): the rows locked, accounts then counters,
-- each in byte order by one statement (the global order; the caller holds the permits);
-- then each segment on the running state: a window or account releases its reservation
-- and takes its commit and liability, a bucket is trued up to its commit (a credit
-- reduced by the refill since admission, exactly as inferplane_settle_permit_v1), an
-- invalid settlement's money windows and accounts are frozen, its in-flight slots
-- (requests windows) freed, and nothing else changes; then one UPDATE per table.
CREATE FUNCTION inferplane_settle_counters_v1(
    g_counter text[], g_kind text[], g_dim text[], g_amount bigint[], g_limit bigint[],
    g_commit bigint[], g_liability bigint[], g_invalid boolean[], g_admitted bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
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
    g_slot int[];
    now_us bigint;
    s int;
    k int;
    v_delta numeric;
BEGIN
    -- The accounts, then the counters, each locked in byte order by one statement.
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
                             FROM authority_accounts a WHERE a.key = ANY(g_counter)
                            ORDER BY a.key COLLATE "C" FOR UPDATE) accounts
            UNION ALL
            SELECT * FROM (SELECT c.key, false, c.balance, c.updated_us, c.reserved,
                                  c.committed, c.liability, 0::bigint, c.frozen, c."limit",
                                  true
                             FROM counters c WHERE c.key = ANY(g_counter)
                            ORDER BY c.key COLLATE "C" FOR UPDATE) counters) r;
    SELECT coalesce(array_agg(array_position(s_key, x.k) ORDER BY x.o), '{}') INTO g_slot
      FROM unnest(g_counter) WITH ORDINALITY AS x(k, o);
    s_dirty := array_fill(false, ARRAY[cardinality(s_key)]);
    now_us := inferplane_now_us_v1();

    -- Each part on the running state, in order; then one UPDATE per table.
    FOR s IN 1..cardinality(g_counter) LOOP
        k := g_slot[s];
        CONTINUE WHEN k IS NULL;
        IF g_invalid[s] THEN
            -- Freeze every money window/account the permit charged and change no other
            -- counter, except that its in-flight slots (requests windows) are freed.
            IF g_kind[s] = 'account' OR (g_kind[s] = 'window' AND g_dim[s] = 'usd') THEN
                s_frozen[k] := true;
                s_dirty[k] := true;
            ELSIF g_kind[s] = 'window' AND g_dim[s] = 'requests' THEN
                s_reserved[k] := s_reserved[k] - g_amount[s];
                s_dirty[k] := true;
            END IF;
            CONTINUE;
        END IF;
        IF g_kind[s] = 'bucket' THEN
            -- True-up exactly as inferplane_settle_permit_v1.
            v_delta := (g_amount[s] - g_commit[s])::numeric * 60000000;
            IF v_delta > 0 THEN
                v_delta := greatest(0, v_delta - g_limit[s]::numeric
                                       * greatest(0, now_us - g_admitted[s]));
            END IF;
            s_balance[k] := least(g_limit[s]::numeric * 60000000,
                                  inferplane_refill_v1(s_balance[k], g_limit[s],
                                                       now_us - s_updated[k])::numeric
                                  + v_delta)::bigint;
            s_updated[k] := greatest(s_updated[k], now_us);
        ELSE
            s_reserved[k] := s_reserved[k] - g_amount[s];
            s_committed[k] := s_committed[k] + g_commit[s];
            s_liability[k] := s_liability[k] + g_liability[s];
        END IF;
        s_dirty[k] := true;
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
END
$$;

-- A batch of settlements parsed once, in batch order (the aggregates read the elements
-- in order): one element of each i_ array per settlement; i_nkeys how many distinct
-- counters its commits and liabilities name.
CREATE FUNCTION inferplane_parse_settlements_v2(
    p_items jsonb, OUT n int, OUT i_permit uuid[], OUT i_kind text[], OUT i_fp text[],
    OUT i_detail text[], OUT i_tc bigint[], OUT i_uc bigint[], OUT i_tl bigint[],
    OUT i_ul bigint[], OUT i_be boolean[], OUT i_commits jsonb[], OUT i_liabs jsonb[],
    OUT i_nkeys int[])
LANGUAGE plpgsql AS $$
BEGIN
    SELECT count(*)::int, array_agg(e.permit_id), array_agg(e.kind), array_agg(e.fp),
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
END
$$;

-- The permits of a batch locked in id order (the p_ arrays, sorted by id) and the
-- pending ones' segments read (the g_ arrays, by permit id then counter in byte order);
-- p_first..p_last each permit's segments (1..0: none).
CREATE FUNCTION inferplane_lock_permits_v2(
    i_permit uuid[], OUT p_id uuid[], OUT p_status text[], OUT p_fp text[],
    OUT p_detail text[], OUT p_admitted bigint[], OUT p_tc bigint[], OUT p_uc bigint[],
    OUT p_tl bigint[], OUT p_ul bigint[], OUT p_be boolean[], OUT p_first int[],
    OUT p_last int[], OUT g_counter text[], OUT g_kind text[], OUT g_dim text[],
    OUT g_amount bigint[], OUT g_limit bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    g_permit uuid[];
    q int := 1;
    s int;
BEGIN
    SELECT coalesce(array_agg(p.id), '{}'), array_agg(p.status),
           array_agg(p.settle_fingerprint), array_agg(p.detail), array_agg(p.admitted_us),
           array_agg(p.tokens_committed), array_agg(p.usd_committed),
           array_agg(p.tokens_liability), array_agg(p.usd_liability),
           array_agg(p.bound_exceeded)
      INTO p_id, p_status, p_fp, p_detail, p_admitted, p_tc, p_uc, p_tl, p_ul, p_be
      FROM (SELECT * FROM permits WHERE id = ANY(i_permit) ORDER BY id FOR UPDATE) p;
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
    FOR s IN 1..cardinality(g_permit) LOOP
        WHILE p_id[q] <> g_permit[s] LOOP
            q := q + 1;
        END LOOP;
        IF p_last[q] = 0 THEN
            p_first[q] := s;
        END IF;
        p_last[q] := s;
    END LOOP;
END
$$;

-- The settled permits' segments (their parts from their settlements' commits and
-- liabilities, u_) and rows (p_dirty), one UPDATE per table.
CREATE FUNCTION inferplane_write_settled_v2(
    u_permit uuid[], u_commits jsonb[], u_liabs jsonb[], p_id uuid[], p_dirty boolean[],
    p_status text[], p_fp text[], p_detail text[], p_tc bigint[], p_uc bigint[],
    p_tl bigint[], p_ul bigint[], p_be boolean[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
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
END
$$;

-- A coalesced batch of settlements, decided set-based. Input: a JSON array of
-- settlements, each inferplane_settle_permit_v1's p_settlement plus its "permit_id",
-- and their request log facts (inferplane_write_facts_v2, written once the permits are
-- locked). Output: one answer per settlement, in order, each what
-- inferplane_settle_permit_v1 would have answered at that point of a serial run (a
-- permit settled twice in one batch is a replay or a conflict the second time, as
-- serially). The work under locks:
--   1. the settlements parsed once into arrays (inferplane_parse_settlements_v2);
--   2. the permits locked by one SELECT ... ORDER BY id FOR UPDATE, their segments read
--      in one statement (inferplane_lock_permits_v2);
--   3. each answer decided in batch order (unknown, replay, conflict, bad commits or
--      settled: none of it reads a counter), and the permits and segments written
--      (inferplane_write_settled_v2) BEFORE any counter is locked;
--   4. the accounts (only when the batch charged one), then the counters, each locked by
--      one sorted SELECT ... FOR UPDATE, and database time read once; the counter
--      arithmetic applied in batch order, one UPDATE per table
--      (inferplane_settle_counters_v1).
CREATE FUNCTION inferplane_settle_v2(p_items jsonb, p_facts jsonb) RETURNS jsonb
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
    g_counter text[];
    g_kind text[];
    g_dim text[];
    g_amount bigint[];
    g_limit bigint[];
    -- The segment updates.
    u_permit uuid[] := '{}';
    u_commits jsonb[] := '{}';
    u_liabs jsonb[] := '{}';
    results jsonb[];
    t int;
    q int;
    -- The settlements that change their permit, and their permits' slots.
    applied int[] := '{}';
    applied_to int[] := '{}';
BEGIN
    SELECT * INTO n, i_permit, i_kind, i_fp, i_detail, i_tc, i_uc, i_tl, i_ul, i_be,
                  i_commits, i_liabs, i_nkeys
      FROM inferplane_parse_settlements_v2(p_items);
    results := array_fill(NULL::jsonb, ARRAY[n]);
    SELECT * INTO p_id, p_status, p_fp, p_detail, p_admitted, p_tc, p_uc, p_tl, p_ul, p_be,
                  p_first, p_last, g_counter, g_kind, g_dim, g_amount, g_limit
      FROM inferplane_lock_permits_v2(i_permit);
    PERFORM inferplane_write_facts_v2(p_facts);
    p_dirty := array_fill(false, ARRAY[cardinality(p_id)]);

    FOR t IN 1..n LOOP
        q := array_position(p_id, i_permit[t]);
        IF q IS NULL THEN
            results[t] := jsonb_build_object('unknown', true);
            CONTINUE;
        END IF;
        IF p_status[q] <> 'pending' THEN
            results[t] := CASE WHEN p_fp[q] = i_fp[t]
                THEN inferplane_answer_v2(p_id[q], p_status[q], p_tc[q], p_uc[q], p_tl[q],
                                          p_ul[q], p_be[q], true)
                ELSE jsonb_build_object('conflict', true, 'kind', p_status[q]) END;
            CONTINUE;
        END IF;
        IF i_kind[t] <> 'invalid' THEN
            results[t] := inferplane_check_commits_v2(
                i_commits[t], i_liabs[t], coalesce(g_counter[p_first[q]:p_last[q]], '{}'),
                i_nkeys[t]);
            CONTINUE WHEN results[t] IS NOT NULL;
            -- Its segments take their parts from its commits and liabilities (every one
            -- named, checked above) in inferplane_write_settled_v2.
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
        results[t] := inferplane_answer_v2(p_id[q], p_status[q], p_tc[q], p_uc[q], p_tl[q],
                                           p_ul[q], p_be[q], false);
    END LOOP;
    IF cardinality(applied) = 0 THEN
        RETURN to_jsonb(results);
    END IF;
    PERFORM inferplane_write_settled_v2(u_permit, u_commits, u_liabs, p_id, p_dirty,
                                        p_status, p_fp, p_detail, p_tc, p_uc, p_tl, p_ul,
                                        p_be);
    PERFORM inferplane_settle_counters_v1(
        coalesce(array_agg(g_counter[x.s]), '{}'), array_agg(g_kind[x.s]),
        array_agg(g_dim[x.s]), array_agg(g_amount[x.s]), array_agg(g_limit[x.s]),
        array_agg((i_commits[x.t] ->> g_counter[x.s])::bigint),
        array_agg(coalesce((i_liabs[x.t] ->> g_counter[x.s])::bigint, 0)),
        array_agg(i_kind[x.t] = 'invalid'), array_agg(p_admitted[x.q]))
      FROM (SELECT a.t, a.q, s.s
              FROM unnest(applied, applied_to) WITH ORDINALITY AS a(t, q, m),
                   generate_series(p_first[a.q], p_last[a.q]) AS s(s)
             ORDER BY a.m, s.s) x;
    RETURN to_jsonb(results);
END
$$;

-- A later exact figure (an operator's, the provider's) for a permit settled uncertain or
-- tokens_known: each window/account moves the permit's part from liability to committed
-- (buckets are left alone: their minute has passed). A pending permit is settled with it.
-- {"conflict": true, "kind"} for a permit settled any other way. Its request log facts
-- are written with the permit locked (inferplane_write_facts_v2).
CREATE FUNCTION inferplane_resolve_v2(p_permit uuid, p_settlement jsonb, p_facts jsonb)
RETURNS jsonb LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    p permits;
    s record;
    v_commit bigint;
    v_liability bigint;
    v_bad jsonb;
BEGIN
    SELECT * INTO p FROM permits WHERE id = p_permit FOR UPDATE;
    PERFORM inferplane_write_facts_v2(p_facts);
    IF p.id IS NULL THEN
        RETURN jsonb_build_object('unknown', true);
    END IF;
    IF p.status = 'pending' THEN
        RETURN inferplane_settle_permit_v1(p_permit, p_settlement);
    END IF;
    IF p.status NOT IN ('uncertain', 'tokens_known') THEN
        RETURN jsonb_build_object('conflict', true, 'kind', p.status);
    END IF;
    v_bad := inferplane_check_parts_v1(p_permit, p_settlement);
    IF v_bad IS NOT NULL THEN
        RETURN v_bad;
    END IF;
    PERFORM inferplane_lock_segments_v1(p_permit);
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
    RETURN inferplane_settle_result_v1(inferplane_record_v1(p_permit, p_settlement, true),
                                       false);
END
$$;

-- Settlements, then admissions, in ONE transaction (the merged lane, merge_batches:
-- true): the permits settled and every row either side takes are locked up front in the
-- global order, then inferplane_settle_v2 (which writes the settlements' request log
-- facts) and inferplane_admit_checked_v2 run on them. Answers {"settled": [...],
-- "admitted": [...]}, each as its own call would.
CREATE FUNCTION inferplane_settle_admit_v2(p_items jsonb, p_facts jsonb, p_requests jsonb)
RETURNS jsonb LANGUAGE plpgsql
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan
SET max_parallel_workers_per_gather = 0 AS $$
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
    v_snapshot := inferplane_snapshot_v1(p_requests);
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
        -- A row is new (a charge's window or account): the row-by-row path, in order.
        now_us := inferplane_now_us_v1();
        FOREACH v_key IN ARRAY v_rows LOOP
            SELECT c.doc INTO ch
              FROM jsonb_array_elements(p_requests) WITH ORDINALITY AS r(doc, o),
                   jsonb_array_elements(r.doc->'charges') AS c(doc)
             WHERE v_snapshot[r.o] IS NULL AND c.doc->>'counter' = v_key LIMIT 1;
            IF ch IS NULL THEN
                -- A row only a settled permit names: it is in one of the two tables.
                PERFORM 1 FROM authority_accounts WHERE key = v_key FOR UPDATE;
                PERFORM 1 FROM counters WHERE key = v_key FOR UPDATE;
            ELSE
                PERFORM inferplane_lock_charge_v1(ch, now_us);
            END IF;
        END LOOP;
    ELSE
        -- Accounts, then counters, each in byte order.
        PERFORM 1 FROM authority_accounts WHERE key = ANY(v_rows)
         ORDER BY key COLLATE "C" FOR UPDATE;
        PERFORM 1 FROM counters WHERE key = ANY(v_rows) ORDER BY key COLLATE "C" FOR UPDATE;
    END IF;

    RETURN jsonb_build_object(
        'settled', inferplane_settle_v2(p_items, p_facts),
        'admitted', inferplane_admit_checked_v2(p_requests, v_snapshot));
END
$$;
