-- Drop every function of inferplane's schema (all are named inferplane_*): the baseline's
-- downgrade, and the pre-release conversion before it installs sql/governance.sql and
-- sql/lease.sql (gateway/schema.py).
DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT oid::regprocedure FROM pg_proc
              WHERE starts_with(proname, 'inferplane_')
                AND pronamespace = current_schema()::regnamespace LOOP
        EXECUTE 'DROP FUNCTION ' || f;
    END LOOP;
END
$$;
