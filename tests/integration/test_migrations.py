"""The alembic migrations build, remove and rebuild the whole shared schema."""

from __future__ import annotations

import psycopg
import pytest

from gateway.governance import AdmissionRequest, Charge
from tests.conftest import migrate

TABLES = {"authority_namespace", "teams", "keys", "bootstrap_declarations", "policy_state",
          "policy_generations", "policy_changes", "counters", "authority_accounts",
          "permits", "permit_segments", "lease_dataplanes", "lease_grants", "alert_events"}


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                            "AND tablename <> 'alembic_version'").fetchall()
    return {r[0] for r in rows}


def _functions(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'inferplane%'")
        return {r[0] for r in rows.fetchall()}


def _team_and_key(conn: psycopg.Connection) -> None:
    """Team t1 and its key k1, written as any release's key store writes them."""
    conn.execute("INSERT INTO teams (id, name) VALUES ('t1', 'one')")
    conn.execute("INSERT INTO keys (id, team_id, key_hash, display_prefix)"
                 " VALUES ('k1', 't1', 'h', 'sk-inf-x')")


def _request(rid: str, charges: tuple[Charge, ...]) -> AdmissionRequest:
    """An admission of team t1's key k1 on 2026-11-30 with these charges."""
    return AdmissionRequest(request_id=rid, key_id="k1", key_revision=1, team_id="t1",
                            team_revision=1, user=None, model="m", token_bound=100,
                            usd_bound=5_000, policy_generation=0, charges=charges,
                            day="2026-11-30", month="2026-11")


def test_empty_to_head_to_base_to_head(pg_empty_dsn: str) -> None:
    """upgrade head creates every table and function; downgrade base removes them all."""
    migrate(pg_empty_dsn)
    assert _tables(pg_empty_dsn) == TABLES
    assert {"inferplane_admit_v1", "inferplane_settle_v1",
            "inferplane_lease_sync_v1"} <= _functions(pg_empty_dsn)
    migrate(pg_empty_dsn, "base", down=True)
    assert _tables(pg_empty_dsn) == set()
    assert _functions(pg_empty_dsn) == set()
    migrate(pg_empty_dsn)
    assert _tables(pg_empty_dsn) == TABLES


def test_head_seeds_singletons(pg_dsn: str) -> None:
    """A migrated database has one authority namespace and policy generation 0."""
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM authority_namespace").fetchone() == (1,)
        assert conn.execute("SELECT generation FROM policy_state").fetchone() == (0,)


def test_upgrade_from_0001_keeps_every_committed_figure(pg_empty_dsn: str) -> None:
    """A database used by the 0001 gateway (admit_v1/settle_v1: one permit settled, one
    pending) upgraded to head keeps every committed and reserved figure, gains zero
    liability, and the pending permit settles through settle_v2."""
    import asyncio
    import json

    import msgspec

    from gateway.governance import (
        Outcome,
        OutcomeKind,
        Permit,
        settlement_for,
    )
    from gateway.governance._postgres import PostgresGovernanceStore

    migrate(pg_empty_dsn, "0001")
    window = "team:t1:usd:day:2026-11-30"
    charges = (Charge(counter="team:t1:tpm", kind="bucket", dimension="tokens", amount=100,
                      limit=10_000),
               Charge(counter=window, kind="window", dimension="usd", amount=5_000,
                      limit=20_000, window="2026-11-30"))

    def req(rid: str) -> AdmissionRequest:
        return _request(rid, charges)
    with psycopg.connect(pg_empty_dsn, autocommit=True) as conn:
        _team_and_key(conn)
        [(done,)] = conn.execute("SELECT inferplane_admit_v1(%s::jsonb)", (
            msgspec.json.encode([req("a"), req("b")]).decode(),)).fetchall()
        first, second = (d["permit_id"] for d in done)
        conn.execute("SELECT inferplane_settle_v1(%s::uuid, 'complete', 'fp', %s::jsonb,"
                     " '', 40, 1234)", (first, json.dumps({"team:t1:tpm": 40,
                                                          window: 1234})))
        before = conn.execute('SELECT reserved, committed FROM counters WHERE key = %s',
                              (window,)).fetchone()
        permits_before = conn.execute("SELECT id, status, tokens_committed, usd_committed"
                                      " FROM permits ORDER BY id").fetchall()
    assert before == (5_000, 1_234)
    migrate(pg_empty_dsn)
    with psycopg.connect(pg_empty_dsn) as conn:
        assert conn.execute("SELECT reserved, committed, liability FROM counters"
                            " WHERE key = %s", (window,)).fetchone() == (5_000, 1_234, 0)
        assert conn.execute("SELECT id, status, tokens_committed, usd_committed FROM"
                            " permits ORDER BY id").fetchall() == permits_before

    async def settle_pending() -> None:
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        async with AsyncConnectionPool(pg_empty_dsn, kwargs={
                "autocommit": True, "row_factory": dict_row}) as pool:
            store = PostgresGovernanceStore(pool)
            permit = Permit(id=second, request=req("b"))
            outcome = Outcome(kind=OutcomeKind.UNCERTAIN, detail="after the upgrade")
            result = await store.settle(permit.id, settlement_for(permit.request, outcome))
            assert (result.usd_committed, result.usd_liability) == (0, 5_000)
    asyncio.run(settle_pending())
    with psycopg.connect(pg_empty_dsn) as conn:
        assert conn.execute("SELECT reserved, committed, liability FROM counters"
                            " WHERE key = %s", (window,)).fetchone() == (0, 1_234, 5_000)


# What each release's gateway called to admit a batch and to settle one.
_RELEASED = {"0003": ("inferplane_admit_v2(%s::jsonb)", ""),
             "0004": ("inferplane_admit_v3(%s::json)", "inferplane_settle_v3(%s::jsonb)"),
             "0005": ("inferplane_admit_v4(%s::json)", "inferplane_settle_v4(%s::jsonb)"),
             "0006": ("inferplane_admit_v5(%s::json)", "inferplane_settle_v5(%s::jsonb)"),
             "0007": ("inferplane_admit_v6(%s::jsonb)", "inferplane_settle_v6(%s::jsonb)"),
             "0008": ("inferplane_admit_v6(%s::jsonb)", "inferplane_settle_v6(%s::jsonb)")}


@pytest.mark.parametrize("start", sorted(_RELEASED))
def test_upgrade_keeps_every_figure_and_head_settles_what_the_old_release_admitted(
        pg_empty_dsn: str, start: str) -> None:
    """A database used by the 0003 gateway (admit_v2/settle_v2), the 0004 one (batches
    through admit_v3/settle_v3), the 0005 one (the v4 calls), the 0006 one (the v5
    calls), the 0007 one (the v6 batch calls) or the 0008 one (v6's batch calls, the v7
    lone ones): permits settled complete and uncertain, two pending; upgraded to head
    (0004 adds the set-based v3 functions, 0005 the v4 calls, 0006 the v5 ones, 0007 the
    v6 batch calls, 0008 the v7 lone calls, 0009 the v8 batch calls) it
    keeps every row of counters, accounts,
    permits and segments unchanged, and the head store settles one pending permit alone
    and the other in a batch, next to a merged admission."""
    import asyncio
    import json

    import msgspec

    from gateway.governance import Permit
    from gateway.governance._postgres import PostgresGovernanceStore
    from tests.settling import exact, settlement

    migrate(pg_empty_dsn, start)
    window = "team:t1:usd:day:2026-11-30"
    account = "account:r1:team:t1:day:2026-11-30"
    charges = (Charge(counter=account, kind="account", dimension="usd", amount=5_000,
                      limit=50_000, window="day", rule_uid="r1"),
               Charge(counter="team:t1:tpm", kind="bucket", dimension="tokens", amount=100,
                      limit=10_000),
               Charge(counter=window, kind="window", dimension="usd", amount=5_000,
                      limit=40_000, window="2026-11-30"))

    def req(rid: str) -> AdmissionRequest:
        return _request(rid, charges)

    def rows(conn: psycopg.Connection) -> dict[str, list[tuple[object, ...]]]:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
                for t in ("counters", "authority_accounts", "permits", "permit_segments")}

    with psycopg.connect(pg_empty_dsn, autocommit=True) as conn:
        _team_and_key(conn)
        admit, settle_batch = _RELEASED[start]
        [(done,)] = conn.execute(f"SELECT {admit}", (
            msgspec.json.encode([req(r) for r in "abcd"]).decode(),)).fetchall()
        ids = [d["permit_id"] for d in done]
        bodies = []
        for pid, rid, kind, usd in ((ids[0], "a", "complete", 1_234),
                                    (ids[1], "b", "uncertain", 200)):
            body = msgspec.to_builtins(settlement(req(rid), exact(40, usd)))
            body.update(kind=kind, fingerprint=f"fp-{rid}", permit_id=pid)
            if kind == "uncertain":
                body["liabilities"] = {window: 4_800, account: 4_800}
                body["usd_liability"] = 4_800
            bodies.append(body)
        if not settle_batch:
            for body in bodies:
                conn.execute("SELECT inferplane_settle_v2(%s::uuid, %s::jsonb)",
                             (body.pop("permit_id"), json.dumps(body)))
        else:
            conn.execute(f"SELECT {settle_batch}", (json.dumps(bodies),))
        before = rows(conn)
    by_key = {r[0]: r for r in before["counters"]}
    assert by_key[window][7:10] == (10_000, 1_434, False)  # reserved, committed, frozen
    migrate(pg_empty_dsn)
    with psycopg.connect(pg_empty_dsn) as conn:
        assert rows(conn) == before

    async def settle_pending() -> None:
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        async with AsyncConnectionPool(pg_empty_dsn, kwargs={
                "autocommit": True, "row_factory": dict_row}) as pool:
            store = PostgresGovernanceStore(pool)
            out = [await store._settle_one(ids[2], settlement(req("c"), exact(50, 300))),
                   *await store._settle_many([(ids[3], settlement(req("d"),
                                                                 exact(60, 400)))])]
            assert [getattr(r, "usd_committed", r) for r in out] == [300, 400]
            settled, [granted] = await store._settle_admit([], [req("e")])
            assert settled == [] and isinstance(granted, Permit)
    asyncio.run(settle_pending())
    with psycopg.connect(pg_empty_dsn) as conn:
        assert conn.execute("SELECT reserved, committed, liability FROM counters"
                            " WHERE key = %s", (window,)).fetchone() == (5_000, 2_134, 4_800)
        assert conn.execute("SELECT reserved, committed, liability FROM authority_accounts"
                            " WHERE key = %s", (account,)).fetchone() == (5_000, 2_134, 4_800)
