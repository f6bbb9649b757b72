-- inferplane's lease ledger: the control plane's heartbeat (ADR-034 §2, made durable;
-- DESIGN §6). Installed by the baseline revision after sql/schema.sql, which holds its
-- tables (lease_dataplanes, lease_grants).
--
-- The ledger lives in the same authority_accounts rows the shared profile admits
-- against: each lease-managed account (one budget rule, one scope, one UTC window) keeps
-- one lease_grants row per data plane, and the account row carries the sums, so shared
-- admission (committed + liability + reserved + leased_outstanding + amount <= limit)
-- and lease grants compete for one budget, and a control-plane restart loses nothing.
--
-- The arithmetic is gateway/lease/_ledger.py line for line (its docstring states the
-- rules; tests/unit/test_lease_ledger.py the invariants; tests/integration checks this
-- SQL against it). All figures are integer µUSD (bigint).
--
-- Locking, in one transaction per heartbeat (inferplane_lease_sync_v1): the plane's
-- lease_dataplanes row FOR UPDATE (two heartbeats of one plane serialise), policy_state
-- FOR SHARE (a publish cannot interleave with the limits the caller computed), then
-- every account row in byte order (COLLATE "C", the order shared admission and
-- settlement lock them in, so they never deadlock), each followed by its grant row.
--
-- Trust (issue 25): a plane id belongs to the data-plane token that first synced it; a
-- heartbeat from another configured token is refused, as is a new frame (fresh counters)
-- while the plane is live or sooner than the caller's frame-change interval after the
-- last one, before any figure moves. Within a frame committed never goes down: a lower
-- figure is refused for that account (the row stays), never adopted. A plane creates
-- ledger rows only for lease-managed accounts, at most the caller's cap of them in the
-- periods the caller accepts.

-- One account of one heartbeat (gateway.lease._ledger.sync). The account row and the
-- grant row are locked by the caller. A report with a "cap" releases: the plane admits
-- nothing beyond it until this answer, so the allowance drops to the cap (never below
-- held) and the grant is exactly "want", or nothing when the budget cannot give "need"
-- (the charge the plane refused). Without a cap the grant is the rule's size, raised to
-- "want". Returns the lease the plane gets, or
-- {"key", "refused": "went_backwards", ...} (nothing changed) for a committed figure
-- below the one already reported in the same frame.
CREATE FUNCTION inferplane_lease_apply_v1(acc jsonb, p_plane text, p_frame text,
                                          p_open boolean, p_now timestamptz)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_key text := acc->>'key';
    v_limit bigint := (acc->>'limit')::bigint;
    v_grant bigint := coalesce((acc->>'grant')::bigint, 0);
    v_want bigint := coalesce((acc->>'want')::bigint, 0);
    v_need bigint := coalesce((acc->>'need')::bigint, 0);
    v_cap bigint := (acc->>'cap')::bigint;
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
    v_held bigint; v_others numeric; v_size bigint; v_extra bigint; v_footprint bigint;
    v_left bigint;
BEGIN
    SELECT * INTO a FROM authority_accounts WHERE key = v_key;
    SELECT * INTO g FROM lease_grants WHERE account = v_key AND dataplane = p_plane;

    b_contrib_c := g.prior_committed + g.committed;
    b_contrib_l := g.prior_unobserved + g.liability;
    b_contrib_o := greatest(g.allowance, g.committed + g.liability + g.reserved)
                   - g.committed - g.liability;

    -- adopt (gateway.lease._ledger.adopt)
    IF p_frame = g.frame AND r_committed < g.committed THEN
        RETURN jsonb_build_object('key', v_key, 'refused', 'went_backwards',
                                  'committed', g.committed, 'reported', r_committed);
    ELSIF p_frame = g.frame THEN
        -- an expired lease admits nothing more: its unused allowance returns to the budget
        n_allowance := CASE WHEN g.expires_at < p_now THEN 0 ELSE g.allowance END;
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
    -- a released allowance: the plane admits nothing beyond the cap it reported
    IF v_cap IS NOT NULL AND p_frame = g.frame THEN
        n_allowance := least(n_allowance, greatest(v_cap, v_held));
    END IF;

    -- grant (gateway.lease._ledger.next_allowance); numeric: sums of bigints
    v_others := a.committed::numeric + a.liability + a.reserved + a.leased_outstanding
                - b_contrib_c - b_contrib_l - b_contrib_o + n_prior_c + n_prior_u;
    v_size := CASE WHEN v_cap IS NOT NULL THEN least(v_want, coalesce(v_limit, 0))
                   ELSE greatest(v_grant, least(v_want, coalesce(v_limit, 0))) END;
    IF v_limit IS NULL OR NOT p_open THEN
        n_allowance := greatest(n_allowance, v_held);
    ELSE
        v_extra := least(v_size::numeric, greatest(0, v_limit - v_others - v_held))::bigint;
        IF v_cap IS NOT NULL AND v_extra < v_need THEN
            v_extra := 0;  -- a piece too small for the refused charge stays in the pool
        END IF;
        n_allowance := greatest(n_allowance, v_held + v_extra);
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

-- The lease a late (stale) heartbeat gets back: the stored row, unchanged.
CREATE FUNCTION inferplane_lease_stored_v1(acc jsonb, p_plane text)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'key', g.account, 'rule_uid', g.rule_uid, 'allowance', g.allowance,
        'renew_ms', g.renew_ms, 'committed', g.committed, 'liability', g.liability,
        'reserved', g.reserved, 'grant', 0, 'remaining', 0, 'limit', a."limit",
        'open', false)
      FROM lease_grants g JOIN authority_accounts a ON a.key = g.account
     WHERE g.account = acc->>'key' AND g.dataplane = p_plane
$$;

-- Lock (creating if missing) an account row and this plane's grant row for it.
CREATE FUNCTION inferplane_lease_lock_v1(acc jsonb, p_plane text)
RETURNS void LANGUAGE plpgsql AS $$
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

-- The plane's ledger rows in the periods the caller accepts (the per-plane cap counts
-- these; rows of older windows are history).
CREATE FUNCTION inferplane_lease_rows_v1(p_plane text, p_limits jsonb)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM lease_grants g JOIN authority_accounts a ON a.key = g.account
     WHERE g.dataplane = p_plane
       AND a.window_period IN (SELECT jsonb_array_elements_text(p_limits->'periods'))
$$;

-- Whether heartbeat dp may be applied to plane row prev: null if so, else the refusal
-- (nothing has moved). A plane belongs to the data-plane token that first synced it
-- while that token is configured (p_limits->'tokens'); a new frame replaces a plane's
-- counters and is refused while the plane is live (its last heartbeat younger than
-- 3 heartbeat intervals) or, once the plane has had an adoption, within
-- p_limits->'frame_change_ms' of its current frame's first heartbeat.
CREATE FUNCTION inferplane_lease_check_plane_v1(prev lease_dataplanes, dp jsonb,
                                                p_limits jsonb, p_now timestamptz)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN prev.token_name <> dp->>'token_name'
             AND prev.token_name IN (SELECT jsonb_array_elements_text(p_limits->'tokens'))
            THEN jsonb_build_object('status', 'token_conflict', 'holder', prev.token_name)
        WHEN prev.seq < 0 OR prev.frame = dp->>'frame' THEN NULL
        WHEN p_now < prev.last_heartbeat + make_interval(
                 secs => 3 * coalesce(prev.heartbeat_ms, (dp->>'heartbeat_ms')::bigint)
                         / 1000.0)
            THEN jsonb_build_object('status', 'frame_live', 'holder', prev.token_name,
                                    'frame', prev.frame,
                                    'last_heartbeat', prev.last_heartbeat)
        WHEN p_now < prev.first_heartbeat
                 + make_interval(secs => (p_limits->>'frame_change_ms')::bigint / 1000.0)
             AND EXISTS (SELECT 1 FROM lease_grants
                          WHERE dataplane = prev.id AND adoptions > 0)
            THEN jsonb_build_object('status', 'frame_rate', 'holder', prev.token_name,
                                    'frame', prev.frame,
                                    'frame_since', prev.first_heartbeat,
                                    'retry_at', prev.first_heartbeat + make_interval(
                                        secs => (p_limits->>'frame_change_ms')::bigint
                                                / 1000.0))
        ELSE NULL END
$$;

-- The plane's record after an applied heartbeat dp (its row is locked by the caller).
CREATE FUNCTION inferplane_lease_record_plane_v1(dp jsonb, p_new_frame boolean,
                                                 p_now timestamptz)
RETURNS void LANGUAGE sql AS $$
    UPDATE lease_dataplanes
       SET token_name = dp->>'token_name', build = coalesce(dp->>'build', ''),
           api_versions = ARRAY(SELECT jsonb_array_elements_text(
                                    coalesce(dp->'api_versions', '[]'::jsonb))),
           frame = dp->>'frame', boot = dp->>'boot', seq = (dp->>'seq')::bigint,
           applied_generation = (dp->>'applied_generation')::bigint,
           rejections = coalesce(dp->'rejections', '[]'::jsonb),
           heartbeat_ms = (dp->>'heartbeat_ms')::bigint,
           last_heartbeat = p_now, heartbeats = heartbeats + 1,
           first_heartbeat = CASE WHEN p_new_frame THEN p_now ELSE first_heartbeat END
     WHERE id = dp->>'id'
$$;

-- One heartbeat, one round trip. Input (built by controlplane/leases.py):
--   {"generation": N,                       -- the policy generation the limits are from
--    "dataplane": {"id", "token_name", "build", "api_versions", "frame", "boot", "seq",
--                  "applied_generation", "rejections", "heartbeat_ms"},
--    "limits": {"tokens": [configured data-plane token names], "frame_change_ms",
--               "max_accounts", "periods": [the periods the caller accepts]},
--    "accounts": [{"key", "rule_uid", "scope", "window", "period", "limit", "hard",
--                  "grant", "renew_ms", "committed", "liability", "reserved", "want",
--                  "need", "cap"}]}
-- "limit" is null for an account whose rule is not a lease-managed budget of generation
-- N: its report is recorded in a row the plane already has, it gets no grant. Output:
-- {"status": "ok" | "stale_heartbeat" | "stale_generation" | "token_conflict" |
-- "frame_live" | "frame_rate", "generation", "day", "month", "leases": [...],
-- "refused": [{"key", "refused": why, ...}], "new_frame": the plane came back with
-- another counter store, "previous_frame", "holder": the token the plane belongs to}.
CREATE FUNCTION inferplane_lease_sync_v1(req jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    dp jsonb := req->'dataplane';
    lim jsonb := req->'limits';
    v_plane text := dp->>'id';
    v_frame text := dp->>'frame';
    v_boot text := dp->>'boot';
    v_seq bigint := (dp->>'seq')::bigint;
    v_now timestamptz := clock_timestamp();
    v_day text := to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD');
    v_month text := to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM');
    prev lease_dataplanes;
    cur_gen bigint;
    v_apply boolean;
    v_open boolean;
    v_refusal jsonb;
    v_why text;
    v_rows bigint;
    v_new_frame boolean;
    acc jsonb;
    lease jsonb;
    leases jsonb := '[]'::jsonb;
    refused jsonb := '[]'::jsonb;
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

    -- 3. Another token's plane, or fresh counters it may not bring now: nothing moves.
    v_refusal := inferplane_lease_check_plane_v1(prev, dp, lim, v_now);
    IF v_refusal IS NOT NULL THEN
        RETURN v_refusal || jsonb_build_object('generation', cur_gen);
    END IF;
    v_new_frame := prev.seq >= 0 AND prev.frame <> v_frame;

    -- A late retry of an older heartbeat of the same process changes nothing.
    v_apply := NOT (prev.frame = v_frame AND prev.boot = v_boot AND prev.seq > v_seq);
    IF v_apply THEN
        PERFORM inferplane_lease_record_plane_v1(dp, v_new_frame, v_now);
    END IF;

    -- 4. Every account, in the lock order shared admission uses.
    FOR acc IN SELECT x FROM jsonb_array_elements(coalesce(req->'accounts', '[]'::jsonb)) x
                ORDER BY x->>'key' COLLATE "C"
    LOOP
        IF NOT v_apply THEN
            leases := leases || coalesce(inferplane_lease_stored_v1(acc, v_plane), '[]');
            CONTINUE;
        END IF;
        -- A new row: only for a lease-managed account, within the plane's cap (counted
        -- once, at the heartbeat's first new row). A rule that is gone still records
        -- the figures of rows the plane already has.
        IF NOT EXISTS (SELECT 1 FROM lease_grants
                        WHERE account = acc->>'key' AND dataplane = v_plane) THEN
            v_rows := coalesce(v_rows, inferplane_lease_rows_v1(v_plane, lim));
            v_why := CASE WHEN acc->>'limit' IS NULL THEN 'not_managed'
                          WHEN v_rows >= (lim->>'max_accounts')::bigint
                              THEN 'too_many_accounts' END;
            IF v_why IS NOT NULL THEN
                refused := refused || jsonb_build_object('key', acc->>'key',
                                                         'refused', v_why);
                CONTINUE;
            END IF;
            v_rows := v_rows + 1;
        END IF;
        PERFORM inferplane_lease_lock_v1(acc, v_plane);
        -- A window that has ended takes no new grant; its late reports settle into it.
        v_open := NOT (SELECT frozen FROM authority_accounts WHERE key = acc->>'key')
                  AND acc->>'period' >= CASE WHEN acc->>'window' = 'day' THEN v_day
                                             ELSE v_month END;
        lease := inferplane_lease_apply_v1(acc, v_plane, v_frame, v_open, v_now);
        IF lease ? 'refused' THEN
            refused := refused || lease;
        ELSE
            leases := leases || lease;
        END IF;
    END LOOP;

    RETURN jsonb_build_object(
        'status', CASE WHEN v_apply THEN 'ok' ELSE 'stale_heartbeat' END,
        'generation', cur_gen, 'day', v_day, 'month', v_month, 'leases', leases,
        'refused', refused, 'new_frame', v_apply AND v_new_frame,
        'previous_frame', prev.frame, 'holder', prev.token_name);
END
$$;

-- Every data plane that ever synced, with its ledger rows, for GET /v1alpha1/dataplanes.
CREATE FUNCTION inferplane_lease_dataplanes_v1() RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object(
        'id', d.id, 'token_name', d.token_name, 'build', d.build,
        'api_versions', to_jsonb(d.api_versions), 'frame', d.frame,
        'applied_generation', d.applied_generation, 'rejections', d.rejections,
        'heartbeat_ms', d.heartbeat_ms, 'first_heartbeat', d.first_heartbeat,
        'last_heartbeat', d.last_heartbeat, 'heartbeats', d.heartbeats,
        'frame_changes', coalesce((SELECT max(g.adoptions) FROM lease_grants g
                                    WHERE g.dataplane = d.id), 0),
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
