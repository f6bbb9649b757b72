-- inferplane shared governance, version 4: the hot calls with plans that do not depend
-- on how big the tables were when a session first planned them (issue 11).
--
-- Installed by migrations/versions/0005_stable_plans.py. Frozen once released, like every
-- _vN file. Same inputs, answers, arithmetic and lock order as the functions each one
-- calls, which stay installed and unchanged: admission and settlement are decided by
-- exactly the v2 and v3 code.
--
-- Why. PL/pgSQL keeps the plan of each statement for the session, and after five calls
-- it keeps a generic one. A gateway connects when the tables are small (a new install:
-- a gateway's pool opens before its traffic): a sequential scan of permits is then the
-- cheapest way to find a batch's permits by id, and a hash join over a sequential scan
-- of permit_segments the cheapest way to update their segments. That plan stays until
-- autovacuum next analyzes the table, while permits grow by a row per request and
-- segments by one per counter. Measured on a connection opened on a fresh database:
-- with 6,400 to 8,000 permits a v3 admit + settle pair in batches of 16 cost 0.45-0.64
-- ms of Postgres CPU, 0.21-0.30 ms with index plans; through one gateway at c=16,
-- Postgres CPU per request fell from 0.94 to 0.63 ms with these calls
-- (tests/bench/speed.py, docs/benchmarks.md). A plan bad enough can also cross
-- jit_above_cost, and JIT compiling one statement then costs ~13 ms, inside the counter
-- locks.
--
-- What. Each function below runs its callee with enable_seqscan off and jit off for the
-- call only (a function's SET clause: restored when it returns, whatever the session
-- set). Every table those calls read or write is reached by its primary key or another
-- index, so no plan needs a sequential scan; the one that remains (policy_state, a
-- single row, no WHERE) costs the same either way. JIT never pays off in statements that
-- touch a few rows. tests/integration/test_pg_plans.py checks, on tables grown to
-- thousands of rows after the session cached its plans, that a batch reads only the
-- rows it names.
--
-- A session should call either these or the _v3 functions, not both: the callee's plans
-- are cached per session whichever wrapper planned them first (the gateway's store uses
-- one set, chosen by PostgresGovernanceStore(functions=...)).

CREATE FUNCTION inferplane_admit_v4(p_requests json) RETURNS jsonb
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
BEGIN
    RETURN inferplane_admit_v3(p_requests);
END
$$;

-- One request alone: v2's per-charge statements cost less than v3's per-batch ones.
CREATE FUNCTION inferplane_admit_one_v4(p_requests jsonb) RETURNS jsonb
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
BEGIN
    RETURN inferplane_admit_v2(p_requests);
END
$$;

CREATE FUNCTION inferplane_settle_v4(p_items jsonb) RETURNS jsonb
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
BEGIN
    RETURN inferplane_settle_v3(p_items);
END
$$;

CREATE FUNCTION inferplane_settle_one_v4(p_permit uuid, p_settlement jsonb) RETURNS jsonb
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
BEGIN
    RETURN inferplane_settle_v2(p_permit, p_settlement);
END
$$;

CREATE FUNCTION inferplane_resolve_v4(p_permit uuid, p_settlement jsonb) RETURNS jsonb
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
BEGIN
    RETURN inferplane_resolve_v2(p_permit, p_settlement);
END
$$;

CREATE FUNCTION inferplane_settle_admit_v4(p_items jsonb, p_requests json) RETURNS jsonb
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $$
BEGIN
    RETURN inferplane_settle_admit_v3(p_items, p_requests);
END
$$;
