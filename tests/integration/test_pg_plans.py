"""The shared store's calls read only the rows they name, however small the tables were
when the connection planned them.

Every entry point of ``sql/governance.sql`` runs with generic plans and sequential scans
off, so the plans a connection caches while the tables hold a few rows stay index plans
as they grow. One connection (one session, so one set of cached plans) sends each named
query of ``sql/queries.sql`` the store sends (``admit_one``, ``admit_batch``,
``settle_one``, ``settle_batch``, ``settle_admit``, ``resolve``) several times while the
tables are small (past the five calls after which PL/pgSQL keeps a generic plan); then
the tables grow to thousands of permits with autovacuum off for them (so nothing
re-plans), and each query runs once more in a transaction, rolled back, around which the
backend's table statistics (``pg_stat_xact_user_tables``) are read: no hot table is
scanned sequentially and each returns only a few rows per request through its indexes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg.rows import dict_row

import sql
from gateway.governance import AdmissionRequest, Charge, OutcomeKind
from gateway.governance._postgres import _facts_json, _settlement_json, _settlements_json
from tests.conftest import create_database, drop_database, dsn_for
from tests.settling import Exact, exact, settlement

pytestmark = pytest.mark.integration

HOT = ("permits", "permit_segments", "counters", "authority_accounts", "keys", "teams")
DAY = "2026-12-01"
CHARGES = (Charge(counter="account:r1:team:t1:day:2026-12-01", kind="account",
                  dimension="usd", amount=2_000, limit=1 << 50, window="day",
                  rule_uid="r1"),
           Charge(counter="team:t1:rpm", kind="bucket", dimension="requests", amount=1,
                  limit=1 << 30),
           Charge(counter="team:t1:tpm", kind="bucket", dimension="tokens", amount=500,
                  limit=1 << 35),
           Charge(counter="team:t1:tokens:day:2026-12-01", kind="window",
                  dimension="tokens", amount=500, limit=1 << 50, window=DAY),
           Charge(counter="team:t1:usd:day:2026-12-01", kind="window", dimension="usd",
                  amount=2_000, limit=1 << 50, window=DAY))


def _request(i: int) -> AdmissionRequest:
    return AdmissionRequest(request_id=f"r{i}", key_id="k1", key_revision=1, team_id="t1",
                            team_revision=1, user=None, model="m", token_bound=500,
                            usd_bound=2_000, policy_generation=0, charges=CHARGES,
                            day=DAY, month="2026-12")


@pytest.fixture
def conn(pg_server_dsn: str, pg_template: str) -> Iterator[psycopg.Connection[Any]]:
    name = f"ipt_{os.getpid()}_plans"
    create_database(pg_server_dsn, name, template=pg_template)
    c = psycopg.connect(dsn_for(pg_server_dsn, name), autocommit=True, row_factory=dict_row)
    try:
        for table in HOT:  # nothing analyzes (and so re-plans) while the test runs
            c.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        c.execute("INSERT INTO teams (id, name) VALUES ('t1', 'one')")
        c.execute("INSERT INTO keys (id, team_id, key_hash, display_prefix)"
                  " VALUES ('k1', 't1', 'h', 'sk-inf-x')")
        yield c
    finally:
        c.close()
        drop_database(pg_server_dsn, name)


Granted = list[tuple[str, AdmissionRequest]]
_EXACT = exact(400, 1_234)
_UNCERTAIN = Exact(tokens=400, usd=1_234, kind=OutcomeKind.UNCERTAIN)


class _Calls:
    """The store's named queries, sent as the store sends them, on one connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn, self.n = conn, 0

    def _requests(self, size: int) -> list[AdmissionRequest]:
        reqs = [_request(self.n + i) for i in range(size)]
        self.n += size
        return reqs

    def admit(self, size: int) -> Granted:
        """``admit_one`` for one request, ``admit_batch`` for more."""
        reqs = self._requests(size)
        [row] = self.conn.execute(
            sql.queries["admit_batch" if size > 1 else "admit_one"],
            {"requests": msgspec.json.encode(reqs).decode()}).fetchall()
        return [(d["permit_id"], r) for d, r in zip(row["results"], reqs, strict=True)]

    def settle(self, granted: Granted, what: Exact = _EXACT) -> None:
        """``settle_one`` for one permit, ``settle_batch`` for more."""
        items = [(pid, settlement(r, what)) for pid, r in granted]
        if len(items) > 1:
            self.conn.execute(sql.queries["settle_batch"],
                              {"items": _settlements_json(items),
                               "facts": _facts_json(items)})
        else:
            [(pid, s)] = items
            self.conn.execute(sql.queries["settle_one"],
                              {"permit_id": pid, "settlement": _settlement_json(s),
                               "facts": _facts_json(items)})

    def settle_admit(self, granted: Granted, size: int) -> Granted:
        """``settle_admit``: ``granted`` settled, then ``size`` requests admitted."""
        items = [(pid, settlement(r, _EXACT)) for pid, r in granted]
        reqs = self._requests(size)
        [row] = self.conn.execute(sql.queries["settle_admit"], {
            "items": _settlements_json(items), "facts": _facts_json(items),
            "requests": msgspec.json.encode(reqs).decode()}).fetchall()
        return [(d["permit_id"], r)
                for d, r in zip(row["results"]["admitted"], reqs, strict=True)]

    def resolve(self, granted: Granted) -> None:
        """``resolve``: each permit (settled uncertain) given its exact figures."""
        for pid, r in granted:
            self.conn.execute(sql.queries["resolve"], {
                "permit_id": pid, "settlement": _settlement_json(settlement(r, _EXACT)),
                "facts": "[]"})


def _each_query(calls: _Calls, size: int) -> Iterator[tuple[str, int, Callable[[], Any]]]:
    """(named query, requests it carries, the call) for each of the store's queries,
    whatever the call needs done first (an admission to settle, a settlement to resolve)
    done before it is yielded."""
    yield ("admit_one", 1, lambda: calls.admit(1))
    yield ("admit_batch", size, lambda: calls.admit(size))
    one = calls.admit(1)
    yield ("settle_one", 1, lambda: calls.settle(one))
    many = calls.admit(size)
    yield ("settle_batch", size, lambda: calls.settle(many))
    held = calls.admit(size)
    yield ("settle_admit", 2 * size, lambda: calls.settle_admit(held, size))
    uncertain = calls.admit(1)
    calls.settle(uncertain, _UNCERTAIN)
    yield ("resolve", 1, lambda: calls.resolve(uncertain))


def _reads(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, int]]:
    """(sequential scans, rows fetched by index) per hot table, as this backend counted
    them so far (its counts not yet flushed: compare two readings)."""
    rows = conn.execute("SELECT relname, seq_scan, coalesce(idx_tup_fetch, 0) AS fetched"
                        " FROM pg_stat_xact_user_tables WHERE relname = ANY(%s)",
                        (list(HOT),)).fetchall()
    return {r["relname"]: (r["seq_scan"], r["fetched"]) for r in rows}


def test_every_call_reads_only_its_rows_after_the_tables_grew(
        conn: psycopg.Connection[Any]) -> None:
    calls = _Calls(conn)
    for _ in range(8):  # small tables: past the five calls after which a plan is kept
        for _query, _n, call in _each_query(calls, 3):
            call()
    for _ in range(60):  # 3,000 permits and 15,000 segments more, on the same plans
        calls.settle(calls.admit(50))
    [row] = conn.execute("SELECT count(*) AS n FROM permits").fetchall()
    assert row["n"] > 3_000
    with conn.transaction(force_rollback=True):
        for query, n, call in _each_query(calls, 4):
            before = _reads(conn)
            call()
            after = _reads(conn)
            reads = {t: (seq - before.get(t, (0, 0))[0], k - before.get(t, (0, 0))[1])
                     for t, (seq, k) in after.items()}
            scanned = {t: seq for t, (seq, _) in reads.items() if seq}
            assert scanned == {}, f"sequential scans in {query} ({n}): {scanned}"
            # each permit, its five segments, its counters and key/team, a few times over
            fetched = {t: k for t, (_, k) in reads.items() if k > 40 * n}
            assert fetched == {}, f"rows fetched by index in {query} ({n}): {fetched}"
