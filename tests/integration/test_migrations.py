"""The baseline revision builds, removes and rebuilds the whole shared schema; `mayu
migrate` brings a 0.1.0 database to head and converts a pre-release one, keeping every
figure."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from gateway.governance import Permit, PostgresGovernanceStore
from gateway.schema import database_heads
from tests.conftest import create_database, drop_database, dsn_for, migrate
from tests.integration._pg_helpers import load_prerelease
from tests.settling import exact, settlement

pytestmark = pytest.mark.integration

TABLES = {"authority_namespace", "teams", "keys", "bootstrap_declarations", "policy_state",
          "policy_generations", "policy_changes", "counters", "authority_accounts",
          "permits", "permit_segments", "lease_dataplanes", "lease_grants", "alert_events",
          "key_rotations", "users", "team_members", "permit_facts", "console_sessions",
          "routing_pins", "client_usage_reports", "permit_tiers"}


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                            "AND tablename <> 'alembic_version'").fetchall()
    return {r[0] for r in rows}


def _functions(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'inferplane%'")
        return {r[0] for r in rows.fetchall()}


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


_FIGURE_TABLES = ("teams", "keys", "counters", "authority_accounts", "permits",
                  "permit_segments", "policy_state", "authority_namespace")


def _rows(dsn: str, tables: tuple[str, ...] = _FIGURE_TABLES
          ) -> dict[str, list[tuple[object, ...]]]:
    with psycopg.connect(dsn) as conn:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
                for t in tables}


def _kept(after: dict[str, list[tuple[object, ...]]],
          before: dict[str, list[tuple[object, ...]]]) -> dict[str, list[tuple[object, ...]]]:
    """``after``'s rows cut to the columns the rows of ``before`` had (later revisions
    append columns, e.g. ``keys.brokered``: the figures kept are the earlier ones)."""
    return {t: [r[:len(before[t][0])] for r in rows] if before.get(t) else rows
            for t, rows in after.items()}


@asynccontextmanager
async def _governance(dsn: str) -> AsyncIterator[PostgresGovernanceStore]:
    """The governance store on ``dsn`` (autocommit, dict rows) for one block."""
    async with AsyncConnectionPool(dsn, kwargs={"autocommit": True,
                                                "row_factory": dict_row}) as pool:
        yield PostgresGovernanceStore(pool)


@asynccontextmanager
async def _open_permit(dsn: str) -> AsyncIterator[tuple[PostgresGovernanceStore, Permit]]:
    """The governance store on ``dsn`` and the one permit pending in it: the request
    ``open`` the old database left in flight."""
    async with _governance(dsn) as store:
        [pending] = await store.pending_permits()
        permit = await store.get_permit(pending)
        assert permit is not None and permit.request.request_id == "open"
        yield store, permit


def test_a_prerelease_database_is_converted_keeping_every_figure(pg_empty_dsn: str) -> None:
    """mayu migrate moves a database at pre-release revision 0009 to the baseline: every
    row (committed, liability, reserved) is kept, the functions are the baseline's, and
    the permit left pending settles afterwards through the new functions."""
    from gateway.governance import Outcome, OutcomeKind, settlement_for
    from gateway.schema import code_heads, schema_problem, structure, upgrade

    load_prerelease(pg_empty_dsn)
    before = _rows(pg_empty_dsn)
    with psycopg.connect(pg_empty_dsn) as conn:
        problem = schema_problem(database_heads(conn))
    assert problem is not None and "pre-release schema (revision 0009)" in problem
    assert "mayu migrate" in problem
    steps: list[object] = []
    assert upgrade(pg_empty_dsn, on_step=steps.append) == code_heads()
    assert "converted" in str(steps[0]) and "v010_baseline" in str(steps[0])
    assert len(steps) > 1  # then alembic: the baseline to head
    assert _kept(_rows(pg_empty_dsn), before) == before
    window, account = "team:t1:usd:day:2026-11-30", "account:org:budget:2026-11"
    with psycopg.connect(pg_empty_dsn) as conn:
        for table, key in (("counters", window), ("authority_accounts", account)):
            assert conn.execute(f"SELECT committed, liability, reserved FROM {table} "
                                "WHERE key = %s", (key,)).fetchone() == (1_234, 5_000, 5_000)
        converted = structure(conn)
    fresh = pg_empty_dsn.rsplit("/", 1)[0] + "/postgres"
    name = f"ipt_{os.getpid()}_fresh_baseline"
    create_database(fresh, name)
    try:
        migrate(dsn_for(fresh, name))
        with psycopg.connect(dsn_for(fresh, name)) as conn:
            assert structure(conn) == converted
    finally:
        drop_database(fresh, name)

    async def settle_pending() -> None:
        async with _open_permit(pg_empty_dsn) as (store, permit):
            cut = Outcome(kind=OutcomeKind.UNCERTAIN, detail="after the conversion")
            result = await store.settle(permit.id, settlement_for(permit.request, cut))
            assert (result.usd_committed, result.usd_liability) == (0, 5_000)
    asyncio.run(settle_pending())
    with psycopg.connect(pg_empty_dsn) as conn:
        assert conn.execute("SELECT committed, liability, reserved FROM counters "
                            "WHERE key = %s", (window,)).fetchone() == (1_234, 10_000, 0)


def test_a_prerelease_database_that_differs_is_refused_unchanged(pg_empty_dsn: str) -> None:
    """A 0009 database whose tables differ from the baseline's is refused with the
    difference and what to do; nothing in it changes (functions and revision included)."""
    from gateway.errors import ConfigError
    from gateway.schema import upgrade

    load_prerelease(pg_empty_dsn)
    with psycopg.connect(pg_empty_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE counters ADD COLUMN note text")
    before, functions = _rows(pg_empty_dsn), _functions(pg_empty_dsn)
    with pytest.raises(ConfigError) as err:
        upgrade(pg_empty_dsn)
    assert "unexpected column: counters 12 note" in str(err.value)
    assert "mayu migrate" in str(err.value)
    assert _rows(pg_empty_dsn) == before and _functions(pg_empty_dsn) == functions
    with psycopg.connect(pg_empty_dsn) as conn:
        assert database_heads(conn) == ("0009",)


def test_an_older_prerelease_revision_is_refused_with_what_to_do(pg_empty_dsn: str) -> None:
    """A database at a pre-release revision before 0009 is refused, naming the commit
    that brings it to 0009; the startup check says the same."""
    from gateway.errors import ConfigError
    from gateway.schema import schema_problem, upgrade

    with psycopg.connect(pg_empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('0005')")
    with pytest.raises(ConfigError, match="cdf51f7"):
        upgrade(pg_empty_dsn)
    problem = schema_problem(("0005",))
    assert problem is not None and "cdf51f7" in problem


AT_0_1_0 = Path(__file__).parent / "data" / "at_0_1_0.sql.gz"
"""A database written by 0.1.0 itself (``data/make_at_0_1_0.py`` run at tag v0.1.0):
team t1's day window, alice's member window and a policy account each hold committed
1,234, liability 3,500 (two uncertain settlements) and reserved 3,000 (one pending
permit); ``pg_dump --inserts``, gzipped."""
_WINDOWS = ("member:{team}:alice:usd:day:2026-11-29", "team:{team}:usd:day:2026-11-29")
_ACCOUNT = "account:r1:team=t1:month:2026-11"


def _figures(dsn: str) -> list[tuple[object, ...]]:
    """committed, liability and reserved of t1's day window, alice's and the account."""
    with psycopg.connect(dsn) as conn:
        [team] = conn.execute("SELECT id FROM teams WHERE name = 't1'").fetchone() or ()
        windows = [w.format(team=team) for w in _WINDOWS]
        rows = conn.execute(
            "SELECT key, committed, liability, reserved FROM counters WHERE key = ANY(%s) "
            "UNION ALL SELECT key, committed, liability, reserved FROM authority_accounts "
            "WHERE key = %s ORDER BY 1", (windows, _ACCOUNT)).fetchall()
    assert [r[0] for r in rows] == [_ACCOUNT, *windows]
    return [r[1:] for r in rows]


def test_a_0_1_0_database_upgrades_to_head_keeping_every_figure(pg_dsn: str,
                                                                 pg_empty_dsn: str) -> None:
    """mayu migrate takes a database 0.1.0 wrote to head: every row and /v1/usage figure
    is unchanged, the schema is a fresh head's, the pending permit then settles exactly
    through head's functions and an uncertain permit's liability is still resolvable."""
    import gzip

    from gateway.governance import UsageRow
    from gateway.schema import code_heads, structure, upgrade

    with psycopg.connect(pg_empty_dsn, autocommit=True) as conn:
        conn.execute(gzip.decompress(AT_0_1_0.read_bytes()).decode())
    with psycopg.connect(pg_empty_dsn) as conn:  # the dump emptied its search_path
        assert database_heads(conn) == ("v010_baseline",)
    tables = (*_FIGURE_TABLES, "permit_facts", "team_members", "users", "key_rotations")
    before = _rows(pg_empty_dsn, tables)
    assert _figures(pg_empty_dsn) == [(1_234, 3_500, 3_000)] * 3

    async def usage() -> list[UsageRow]:
        async with _governance(pg_empty_dsn) as store:
            rows = await store.usage(day="2026-11-29", month="2026-11")
        return sorted(rows, key=repr)
    usage_before = asyncio.run(usage())
    assert any((r.usd_committed, r.usd_liability, r.usd_reserved) == (1_234, 3_500, 3_000)
               for r in usage_before)

    steps: list[object] = []
    assert upgrade(pg_empty_dsn, on_step=steps.append) == code_heads()
    assert "v011_console_sessions" in " ".join(map(str, steps))
    assert _kept(_rows(pg_empty_dsn, tables), before) == before
    assert asyncio.run(usage()) == usage_before
    with psycopg.connect(pg_empty_dsn) as upgraded, psycopg.connect(pg_dsn) as fresh:
        assert structure(upgraded) == structure(fresh)

    async def settle_and_resolve() -> None:
        async with _open_permit(pg_empty_dsn) as (store, permit):
            done = await store.settle(permit.id, settlement(permit.request,
                                                            exact(50, 2_500)))
            assert (done.usd_committed, done.usd_liability) == (2_500, 0)
            with psycopg.connect(pg_empty_dsn) as conn:
                [cut] = conn.execute("SELECT id FROM permits WHERE request_id = 'cut2'"
                                     ).fetchone() or ()
            cut2 = await store.get_permit(str(cut))
            assert cut2 is not None and cut2.request.usd_bound == 1_500
            resolved = await store.resolve(cut2.id, settlement(cut2.request,
                                                                exact(40, 1_000)))
            assert (resolved.usd_committed, resolved.usd_liability) == (1_000, 0)
    asyncio.run(settle_and_resolve())
    # 1,234 + 2,500 + 1,000 committed; 3,500 - 1,500 liability; nothing in flight.
    assert _figures(pg_empty_dsn) == [(4_734, 2_000, 0)] * 3
