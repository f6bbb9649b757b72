-- inferplane_settle_admit_v3: the settlements and admissions a gateway has waiting at
-- once, in ONE transaction (one commit, one round trip): settlements first, then
-- admissions (docs/hot-team.md step 5; issue 11).
--
-- Input: inferplane_settle_v3's array and inferplane_admit_v3's array. Output:
-- {"settled": <inferplane_settle_v3's answer>, "admitted": <inferplane_admit_v3's>},
-- each element exactly what that function alone would answer at that point: the batch is
-- the serial run "every settlement in order, then every admission in order", which is a
-- legal order because every operation in it was pending at once.
--
-- Locks: one transaction now holds rows of both kinds, so it takes them all first in the
-- one global order — definitions (keys, teams FOR SHARE; policy_state FOR SHARE), then
-- permits by id, then accounts, then counters by key (a sorted union of the permits'
-- segments and the charges of the requests whose snapshot is current; a missing row is
-- created on v1's row-by-row path, in the same order) — and only then calls the two functions, whose own lock statements
-- find every row held already. So the batch never waits on rows in an order another
-- transaction could invert.
-- Frozen once released; a change is a _v4 in a new file and revision.

CREATE FUNCTION inferplane_settle_admit_v3(p_items jsonb, p_requests json)
RETURNS jsonb LANGUAGE plpgsql AS $$
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
