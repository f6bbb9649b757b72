"""The equivalence oracle: every admission and settlement call answers, and leaves every
row, exactly as its reference, the general path taken request by request.

``sql/governance.sql`` holds one definition per call and no version history, so nothing
older can vouch for the fast calls: they are checked against the general path, which
decides one request (or one settlement) at a time and is the written semantics. The
references are ``inferplane_admit_serial_v1`` (admissions one after another, in batch
order) and ``inferplane_settle_permit_v1`` (one permit; a batch's settlements item by
item in one transaction).

A property test (hypothesis) drives one database through random sequences of admission
batches and settlement batches — refusals of every kind, new windows created mid-run,
in-flight slots (taken, refused when full, freed by every settlement kind),
leased accounts, frozen accounts, snapshot mismatches, the same permit twice in one
batch, replays, conflicts, unknown permits, missing and extra commits. Each batch runs
several times on the same state: first through its reference, whose answers and
resulting rows are recorded and rolled back; then through the lone call, rolled back
(``inferplane_admit_one_v2`` request by request, ``inferplane_settle_one_v2`` item by
item: their own statements, not the reference's); then through the batch call the store
sends, which commits (``inferplane_admit_v2`` on the admissions,
``inferplane_settle_v2`` on the settlements). A merged batch
(``inferplane_settle_admit_v2``: settlements, then admissions, one transaction, through
the batch bodies ``inferplane_settle_v2`` and ``inferplane_admit_checked_v2``) is
compared with its serial run: each settlement through ``inferplane_settle_permit_v1``,
then the admissions through ``inferplane_admit_serial_v1``. Answers and every row of
counters, accounts, permits and segments must be equal (permit ids, which each function
draws at random, are compared through their request ids), and no answer carries an HTTP
status (the gateway derives it from the code, ``gateway/governance/_refusal.py``).

Database time is pinned for this: the test database's ``inferplane_now_us_v1`` reads a
session setting the test advances between batches (only in this throwaway database), so
bucket refill and true-up are compared exactly, not within a tolerance.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from tests.conftest import create_database, drop_database, dsn_for

pytestmark = pytest.mark.integration

TEAMS = ("ta", "tb")
DAYS = ("2026-12-01", "2026-12-02")


@pytest.fixture(scope="module")
def db(pg_server_dsn: str, pg_template: str) -> Iterator[psycopg.Connection[Any]]:
    name = f"ipt_{os.getpid()}_batcheq"
    create_database(pg_server_dsn, name, template=pg_template)
    conn = psycopg.connect(dsn_for(pg_server_dsn, name), autocommit=True,
                           row_factory=dict_row)
    try:
        # Pin the clock in this throwaway database only (see the module docstring).
        conn.execute("CREATE OR REPLACE FUNCTION inferplane_now_us_v1() RETURNS bigint "
                     "LANGUAGE sql VOLATILE AS "
                     "$$ SELECT current_setting('inferplane.test_now_us')::bigint $$")
        for team in TEAMS:
            conn.execute("INSERT INTO teams (id, name) VALUES (%s, %s)", (team, team))
            conn.execute("INSERT INTO keys (id, team_id, key_hash, display_prefix) "
                         "VALUES (%s, %s, %s, 'k')", (f"k-{team}", team, f"h-{team}"))
        yield conn
    finally:
        conn.close()
        drop_database(pg_server_dsn, name)


# -- what a batch is --------------------------------------------------------------------

charge_spec = st.fixed_dictionaries({
    "tokens": st.integers(0, 900), "usd": st.integers(0, 12_000),
    "day": st.sampled_from(DAYS), "team": st.sampled_from(TEAMS),
    "key_revision": st.sampled_from([1] * 15 + [2]),
    "account": st.booleans(), "slot": st.booleans(),
})
# The limits a batch was planned with, per team: one batch's requests for one team carry
# the same limits and hardness (a team or policy edit between two plans is a snapshot
# mismatch; which of two differing definitions creates a new row is not specified),
# and they change from batch to batch.
limits_spec = st.fixed_dictionaries({
    "tpm": st.sampled_from([600, 5_000, 50_000]), "token_limit": st.sampled_from([None, 1_500]),
    "usd_limit": st.sampled_from([None, 9_000, 20_000]),
    "account_limit": st.sampled_from([15_000, 30_000]),
    "hard": st.sampled_from([True, True, False]),
    "slot_limit": st.sampled_from([1, 3]),
})
batch_spec = st.tuples(st.fixed_dictionaries({t: limits_spec for t in TEAMS}),
                       st.lists(charge_spec, min_size=1, max_size=6))
settle_spec = st.fixed_dictionaries({
    "pick": st.integers(0, 10_000), "unknown": st.sampled_from([False] * 9 + [True]),
    "kind": st.sampled_from(["complete", "complete", "uncertain", "tokens_known",
                             "cancelled", "invalid"]),
    "fingerprint": st.sampled_from(["fa", "fb"]),
    "scale": st.integers(0, 200), "liability": st.integers(0, 3),
    "broken": st.sampled_from([None] * 8 + ["missing", "extra"]),
    "bound_exceeded": st.booleans(),
})
step = st.one_of(
    st.tuples(st.just("admit"), batch_spec),
    st.tuples(st.just("settle"), st.lists(settle_spec, min_size=1, max_size=6)),
    st.tuples(st.just("both"), st.tuples(st.lists(settle_spec, min_size=1, max_size=5),
                                         batch_spec)),
    st.tuples(st.just("lease"), st.integers(0, 12_000)),
    st.tuples(st.just("wait"), st.integers(0, 90_000_000)),
)


def _request(limits: dict[str, dict[str, Any]], spec: dict[str, Any],
             rid: str) -> dict[str, Any]:
    team, day = spec["team"], spec["day"]
    spec = {**spec, **limits[team]}
    charges = [
        {"counter": f"team:{team}:tpm", "kind": "bucket", "dimension": "tokens",
         "amount": spec["tokens"], "limit": spec["tpm"], "window": None,
         "rule_uid": None, "hard": True},
        {"counter": f"team:{team}:tokens:day:{day}", "kind": "window",
         "dimension": "tokens", "amount": spec["tokens"], "limit": spec["token_limit"],
         "window": day, "rule_uid": None, "hard": True},
        {"counter": f"team:{team}:usd:day:{day}", "kind": "window", "dimension": "usd",
         "amount": spec["usd"], "limit": spec["usd_limit"], "window": day,
         "rule_uid": None, "hard": spec["hard"]},
    ]
    if spec["account"]:
        charges.append({"counter": f"account:r1:team:{team}:day:{day}", "kind": "account",
                        "dimension": "usd", "amount": spec["usd"],
                        "limit": spec["account_limit"],
                        "window": "day", "rule_uid": "r1", "hard": spec["hard"]})
    if spec["slot"]:
        # A concurrency rule's in-flight slot: refused (concurrency_limited) when full,
        # freed by every settlement, an invalid one included.
        charges.append({"counter": f"rule:c1:team={team}:inflight", "kind": "window",
                        "dimension": "requests", "amount": 1, "limit": spec["slot_limit"],
                        "window": None, "rule_uid": "c1", "hard": True})
    charges.sort(key=lambda c: c["counter"])
    return {"request_id": rid, "key_id": f"k-{team}", "key_revision": spec["key_revision"],
            "team_id": team, "team_revision": 1, "user": None, "model": "m",
            "token_bound": spec["tokens"], "usd_bound": spec["usd"],
            "policy_generation": 0, "charges": charges, "day": day, "month": day[:7]}


def _settlement(spec: dict[str, Any], permit_id: str,
                charges: list[dict[str, Any]]) -> dict[str, Any]:
    # An in-flight slot commits 0 and keeps no liability (gateway.governance.split_settlement).
    commits = {c["counter"]: 0 if c["dimension"] == "requests"
               else c["amount"] * spec["scale"] // 100 for c in charges}
    liabilities = {c["counter"]: c["amount"] * spec["liability"] // 4
                   for c in charges[: spec["liability"]]
                   if c["kind"] != "bucket" and c["dimension"] != "requests"}
    if spec["broken"] == "missing" and commits:
        commits.pop(sorted(commits)[-1])
    elif spec["broken"] == "extra":
        liabilities["team:nobody:usd:day:2026-12-01"] = 1
    tokens = sum(v for k, v in commits.items() if ":tokens:" in k)
    usd = sum(v for k, v in commits.items() if ":usd:" in k)
    return {"permit_id": permit_id, "kind": spec["kind"], "fingerprint": spec["fingerprint"],
            "detail": f"d-{spec['fingerprint']}", "tokens_committed": tokens,
            "usd_committed": usd, "tokens_liability": spec["liability"],
            "usd_liability": spec["liability"] * 10,
            "bound_exceeded": spec["bound_exceeded"], "commits": commits,
            "liabilities": liabilities}


# -- running a batch every way ----------------------------------------------------------

def _state(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    rid = {r["id"]: r["request_id"] for r in conn.execute("SELECT id, request_id FROM permits")}
    permits = conn.execute(
        "SELECT * FROM permits ORDER BY request_id").fetchall()
    for p in permits:
        p["id"] = p["request_id"]
        p.pop("created_at")
        p["settled"] = p.pop("settled_at") is not None
    segments = conn.execute("SELECT * FROM permit_segments").fetchall()
    for s in segments:
        s["permit_id"] = rid[s["permit_id"]]
    segments.sort(key=lambda s: (s["permit_id"], s["counter"]))
    return {
        "counters": conn.execute("SELECT * FROM counters ORDER BY key").fetchall(),
        "accounts": conn.execute("SELECT * FROM authority_accounts ORDER BY key").fetchall(),
        "permits": permits, "segments": segments,
    }


def _normal(results: list[dict[str, Any]], conn: psycopg.Connection[Any]) -> list[Any]:
    """Answers with each permit id replaced by its request id."""
    rid = {str(r["id"]): r["request_id"]
           for r in conn.execute("SELECT id, request_id FROM permits")}
    out = []
    for r in results:
        r = dict(r)
        if "permit_id" in r:
            r["permit_id"] = rid.get(str(r["permit_id"]), r["permit_id"])
        out.append(r)
    return out


Calls = Callable[[], list[Any]]


def _pin(conn: psycopg.Connection[Any], now_us: int) -> None:
    conn.execute("SELECT set_config('inferplane.test_now_us', %s, true)", (str(now_us),))


def _equal(conn: psycopg.Connection[Any], now_us: int, reference: Calls, committed: Calls,
           **others: Calls) -> list[Any]:
    """Run ``reference`` (rolled back), each of ``others`` (rolled back), then
    ``committed`` (committed) on the same state: answers and rows must all equal the
    reference's. Returns ``committed``'s answers as given (their permit ids are the ones
    left in the database)."""
    with conn.transaction(force_rollback=True):
        _pin(conn, now_us)
        expected = _normal(reference(), conn)
        expected_state = _state(conn)
    for name, other in others.items():
        with conn.transaction(force_rollback=True):
            _pin(conn, now_us)
            assert _normal(other(), conn) == expected, name
            assert _state(conn) == expected_state, name
    with conn.transaction():
        _pin(conn, now_us)
        raw = committed()
        assert _normal(raw, conn) == expected, "batch call"
        assert _state(conn) == expected_state, "batch call"
    for r in expected:
        assert "status" not in r, r  # a fact, never an HTTP status
        # what the examples covered (pytest --hypothesis-show-statistics)
        event("conflict" if r.get("conflict") else "replay" if r.get("replay")
              else str(r.get("reason") or r.get("problem") or r.get("kind")
                       or ("unknown" if r.get("unknown") else "granted")))
    return list(raw)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(steps=st.lists(step, min_size=1, max_size=14))
def test_every_call_answers_and_writes_as_the_serial_path(
        db: psycopg.Connection[Any], steps: list[tuple[str, Any]]) -> None:
    db.execute("TRUNCATE permit_segments, permits, counters, authority_accounts, "
               "lease_grants")
    now_us = 1_764_590_400_000_000
    permits: list[tuple[str, list[dict[str, Any]]]] = []
    n = 0
    for what, arg in steps:
        if what == "wait":
            now_us += arg
            continue
        if what == "lease":
            db.execute("UPDATE authority_accounts SET leased_outstanding = %s", (arg,))
            continue
        if what == "admit":
            reqs = []
            for spec in arg[1]:
                n += 1
                reqs.append(_request(arg[0], spec, f"r{n:03}"))
            body = json.dumps(reqs)
            results = _equal(
                db, now_us,
                reference=partial(_call, db, "inferplane_admit_serial_v1(%s::jsonb)", body),
                committed=partial(_call, db, "inferplane_admit_v2(%s::jsonb)", body),
                admit_one=partial(_admit_each, db, reqs))
            permits += [(r["permit_id"], q["charges"])
                        for q, r in zip(reqs, results, strict=True) if "permit_id" in r]
            continue
        if what == "settle":
            items = _items(arg, permits)
            _equal(db, now_us,
                   reference=partial(_settle_each, db, items, _SETTLE_PERMIT),
                   committed=partial(_call, db, f"inferplane_settle_v2(%s::jsonb, {_NO_FACTS})",
                                     json.dumps(items)),
                   settle_one=partial(_settle_each, db, items, _SETTLE_ONE))
            continue
        # Settlements and admissions in one transaction.
        items = _items(arg[0], permits)
        reqs = []
        for spec in arg[1][1]:
            n += 1
            reqs.append(_request(arg[1][0], spec, f"r{n:03}"))
        body = json.dumps(reqs)
        results = _equal(db, now_us, reference=partial(_serial, db, items, body),
                         committed=partial(_merged, db, items, body))[len(items):]
        permits += [(r["permit_id"], q["charges"])
                    for q, r in zip(reqs, results, strict=True) if "permit_id" in r]


def _items(specs: list[dict[str, Any]],
           permits: list[tuple[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    items = []
    for spec in specs:
        if spec["unknown"] or not permits:
            items.append(_settlement(spec, str(uuid.uuid4()), []))
        else:
            permit_id, charges = permits[spec["pick"] % len(permits)]
            items.append(_settlement(spec, permit_id, charges))
    return items


def _call(db: psycopg.Connection[Any], call: str, *args: Any) -> Any:
    """The one value ``SELECT <call>`` returns."""
    return db.execute(f"SELECT {call} AS r", args).fetchone()["r"]  # type: ignore[index]


def _admit_each(db: psycopg.Connection[Any], reqs: list[dict[str, Any]]) -> list[Any]:
    """Each admission alone through the lone call, in order (in the caller's
    transaction)."""
    return [_call(db, "inferplane_admit_one_v2(%s::jsonb)", json.dumps([r]))[0]
            for r in reqs]


# The request log's facts are not compared here (tests/integration/test_request_log_facts.py).
_NO_FACTS = "'[]'::jsonb"
_SETTLE_PERMIT = "inferplane_settle_permit_v1(%s::uuid, %s::jsonb)"
_SETTLE_ONE = f"inferplane_settle_one_v2(%s::uuid, %s::jsonb, {_NO_FACTS})"


def _settle_each(db: psycopg.Connection[Any], items: list[dict[str, Any]],
                 call: str) -> list[Any]:
    """Each settlement alone, in order (in the caller's transaction)."""
    return [_call(db, call, i["permit_id"], json.dumps(i)) for i in items]


def _serial(db: psycopg.Connection[Any], items: list[dict[str, Any]],
            body: str) -> list[Any]:
    """A merged batch's serial run: each settlement through the reference, then the
    admissions through theirs."""
    return [*_settle_each(db, items, _SETTLE_PERMIT),
            *_call(db, "inferplane_admit_serial_v1(%s::jsonb)", body)]


def _merged(db: psycopg.Connection[Any], items: list[dict[str, Any]],
            body: str) -> list[Any]:
    out = _call(db, f"inferplane_settle_admit_v2(%s::jsonb, {_NO_FACTS}, %s::jsonb)",
                json.dumps(items), body)
    return [*out["settled"], *out["admitted"]]
