-- inferplane_admit_v2: admission with liability and refusal figures (DESIGN §4–§5).
--
-- Same contract, locking and lock order as inferplane_admit_v1 (which stays installed and
-- unchanged); it reuses v1's lock/reserve/write helpers. Two differences:
--   * a hard window or account refuses when committed + liability + reserved (+ leased)
--     + amount would pass its limit: liability binds like a reservation (DESIGN §5);
--   * a refusal carries the figures the counter held ({"limit", "committed",
--     "liability", "reserved", "leased", "amount", "window", "dimension"}), so the
--     gateway words it exactly as the local store does (gateway/governance/_refusal.py);
--   * a permit carries each charged bucket's balance right after its reservation
--     ({"permit_id", "buckets": {counter: balance}}), read under the lock already held,
--     so the remaining-limit response headers cost no extra round trip.
-- Frozen once released; a change is inferplane_admit_v3 in a new file and revision.

-- Would this (locked) charge fit? NULL if yes, else the refusal with its figures.
CREATE FUNCTION inferplane_check_charge_v2(ch jsonb, now_us bigint)
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

CREATE FUNCTION inferplane_admit_v2(requests jsonb) RETURNS jsonb
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
