-- inferplane_admit_v1: decide several admissions in ONE round trip (DESIGN §4, ADR-046).
--
-- Input: a JSON array of gateway.governance.AdmissionRequest (msgspec-encoded); each
-- request's charges were planned in Python (gateway.governance.plan_charges).
-- Output: a JSON array, one element per request, in order: {"permit_id": uuid} or
-- {"status", "reason", "counter", "retry_after"} (429 rate/tokens, 402 money, 503
-- snapshot mismatch). Each request is all-or-none on its own.
--
-- Locking (READ COMMITTED + explicit row locks, so a hot team is serialised by its row
-- lock and never by serialization-failure retries):
--   1. keys, then teams, FOR SHARE (revoke/edit take FOR UPDATE: they serialise against
--      admission, admissions do not serialise on each other); policy_state FOR SHARE;
--   2. every counter/account of the batch, in one byte-ordered (COLLATE "C", the same
--      order as Python's sorted()) pass over the union of counter keys; a missing row is
--      created by INSERT ... ON CONFLICT DO NOTHING and then locked.
-- Settlement locks the same rows in the same order, so the two never deadlock.
-- Frozen once released; a change is inferplane_admit_v2 in a new file and revision.

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

-- Database time in whole µs since the epoch (extract returns numeric: exact).
CREATE FUNCTION inferplane_now_us_v1() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
$$;

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
$$;

-- Would this (locked) charge fit? NULL if yes, else the refusal.
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

CREATE FUNCTION inferplane_admit_v1(requests jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
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
