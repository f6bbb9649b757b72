-- inferplane_settle_v1: settle one permit exactly once (DESIGN §5, ADR-039, ADR-046).
--
-- p_commits maps each charged counter to what it commits (gateway.governance.commits_for);
-- it must name exactly the permit's counters (else {"bad_commits": counter, "problem"},
-- nothing changed). p_tokens / p_usd are the permit's committed totals, NULL = its bounds.
-- Returns {"permit_id", "kind", "tokens_committed", "usd_committed", "replay"}, or
-- {"conflict": true, "kind": <stored kind>} for a different second outcome, or
-- {"unknown": true} for a permit this database never granted.
--
-- Settlement re-reads the windows and limits captured in permit_segments, never current
-- policy, so a policy deletion or midnight between admission and settlement cannot move
-- a charge. Counters are locked in the same byte order as admission (no deadlocks).
-- Frozen once released; a change is inferplane_settle_v2 in a new file and revision.

CREATE FUNCTION inferplane_settle_v1(p_permit uuid, p_kind text, p_fingerprint text,
                                     p_commits jsonb, p_detail text, p_tokens bigint,
                                     p_usd bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
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
