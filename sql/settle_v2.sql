-- inferplane_settle_v2 / inferplane_resolve_v2: settlement with the three figures
-- (DESIGN §5, ADR-039, ADR-046). inferplane_settle_v1 stays installed and unchanged.
--
-- p_settlement is gateway.governance.Settlement plus its fingerprint:
--   {"kind", "fingerprint", "detail", "tokens_committed", "usd_committed",
--    "tokens_liability", "usd_liability", "bound_exceeded",
--    "commits": {counter: amount}, "liabilities": {counter: amount}}
-- commits must name exactly the permit's counters (else {"bad_commits", "problem"},
-- nothing changed); liabilities only counters it charged. A window or account releases
-- its reservation, commits its part and adds its liability (which binds admission like a
-- reservation, inferplane_check_charge_v2); a bucket is trued up to its commit exactly
-- as in v1. Invalid usage changes no counter and freezes the permit's money windows and
-- accounts. Returns {"permit_id", "kind", "tokens_committed", "usd_committed",
-- "tokens_liability", "usd_liability", "bound_exceeded", "replay"}, or {"conflict": true,
-- "kind"} for a different second settlement, or {"unknown": true}.
-- Counters are locked in the same byte order as admission (no deadlocks).
-- Frozen once released; a change is a _v3 in a new file and revision.

-- The permit's counters named in p_settlement that it did not charge, or that it
-- charged and p_settlement does not commit: NULL when they match.
CREATE FUNCTION inferplane_check_parts_v2(p_permit uuid, p_settlement jsonb)
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

CREATE FUNCTION inferplane_lock_segments_v2(p_permit uuid)
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

CREATE FUNCTION inferplane_settle_result_v2(p permits, p_replay boolean)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('permit_id', p.id, 'kind', p.status,
                              'tokens_committed', p.tokens_committed,
                              'usd_committed', p.usd_committed,
                              'tokens_liability', coalesce(p.tokens_liability, 0),
                              'usd_liability', coalesce(p.usd_liability, 0),
                              'bound_exceeded', p.bound_exceeded, 'replay', p_replay)
$$;

-- Record a permit's settlement (or a later resolution) and return the updated row.
CREATE FUNCTION inferplane_record_v2(p_permit uuid, p_settlement jsonb, p_resolution boolean)
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

CREATE FUNCTION inferplane_settle_v2(p_permit uuid, p_settlement jsonb)
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

-- A later exact figure (an operator's, the provider's) for a permit settled uncertain or
-- tokens_known: each window/account moves the permit's part from liability to committed
-- (buckets are left alone: their minute has passed). A pending permit is settled with it.
-- {"conflict": true, "kind"} for a permit settled any other way.
CREATE FUNCTION inferplane_resolve_v2(p_permit uuid, p_settlement jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
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
