"""``sql/lease.sql`` against real Postgres: the same arithmetic as gateway.lease._ledger.

Sequences of heartbeats from several planes (fresh frames of silent planes, lower
figures, retries, a shared reservation on the same account) run through
``inferplane_lease_sync_v1`` and through the pure functions; the stored rows and account
sums must agree exactly, and a lower figure within a frame is refused by both.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.lease._ledger import Account, LedgerRow, Report, WentBackwards, sync

pytestmark = pytest.mark.integration

_case = itertools.count()


def heartbeat(conn: psycopg.Connection[Any], *, plane: str, key: str, frame: str,
              committed: int, liability: int = 0, reserved: int = 0, want: int = 0,
              need: int = 0, cap: int | None = None,
              limit: int | None, grant: int, seq: int, boot: str = "b",
              period: str = "2999-01", renew_ms: int = 600_000) -> dict[str, Any]:
    req = {"generation": 0,
           "limits": {"tokens": ["t"], "frame_change_ms": 0, "max_accounts": 1_000,
                      "periods": [period]},
           "dataplane": {"id": plane, "token_name": "t", "frame": frame, "boot": boot,
                         "seq": seq, "applied_generation": 0, "rejections": [],
                         "heartbeat_ms": 1000, "api_versions": ["inferplane.dev/v1alpha1"]},
           "accounts": [{"key": key, "rule_uid": "p/r", "scope": "team=t", "window": "month",
                         "period": period, "limit": limit, "hard": True, "grant": grant,
                         # leases valid for 30 min: none expires during a test (an expired
                         # one returns its allowance: test_lease_strand_sql.py)
                         "renew_ms": renew_ms, "committed": committed, "liability": liability,
                         "reserved": reserved, "want": want, "need": need,
                         "cap": cap}]}
    row = conn.execute("SELECT inferplane_lease_sync_v1(%s::jsonb)", (json.dumps(req),))
    result: dict[str, Any] = row.fetchone()[0]  # type: ignore[index]
    return result


def silence(conn: psycopg.Connection[Any], plane: str) -> None:
    """Make ``plane`` look silent for an hour (a new frame is then accepted)."""
    conn.execute("UPDATE lease_dataplanes SET last_heartbeat = last_heartbeat"
                 " - interval '1 hour' WHERE id = %s", (plane,))


def stored(conn: psycopg.Connection[Any], key: str, plane: str) -> LedgerRow:
    row = conn.execute(
        "SELECT frame, committed, liability, reserved, allowance, prior_committed,"
        " prior_unobserved, adoptions FROM lease_grants WHERE account = %s AND dataplane = %s",
        (key, plane)).fetchone()
    assert row is not None
    return LedgerRow(frame=row[0], committed=row[1], liability=row[2], reserved=row[3],
                     allowance=row[4], prior_committed=row[5], prior_unobserved=row[6],
                     adoptions=row[7])


def account(conn: psycopg.Connection[Any], key: str) -> Account:
    row = conn.execute("SELECT committed, liability, reserved, leased_outstanding"
                       " FROM authority_accounts WHERE key = %s", (key,)).fetchone()
    assert row is not None
    return Account(committed=row[0], liability=row[1], reserved=row[2],
                   leased_outstanding=row[3])


_beats = st.lists(st.tuples(
    st.integers(min_value=0, max_value=2),          # plane
    st.integers(min_value=0, max_value=1),          # frame change
    st.integers(min_value=-50, max_value=400),      # committed change (negative: lower)
    st.integers(min_value=0, max_value=300),        # liability
    st.integers(min_value=0, max_value=300),        # reserved
    st.integers(min_value=0, max_value=500),        # want
    st.integers(min_value=0, max_value=500),        # need
    st.one_of(st.none(), st.integers(min_value=0, max_value=1_500))),  # cap (release)
    min_size=1, max_size=25)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(beats=_beats, limit=st.integers(min_value=0, max_value=3_000),
       grant=st.integers(min_value=0, max_value=400),
       shared_reserved=st.integers(min_value=0, max_value=500))
def test_sql_ledger_matches_the_python_arithmetic(
        pg_dsn: str, beats: list[tuple[int, int, int, int, int, int, int, int | None]],
        limit: int, grant: int,
        shared_reserved: int) -> None:
    """Every heartbeat leaves the grant rows and the account sums exactly where
    gateway.lease._ledger.sync puts them (a shared reservation and releases included)."""
    case = next(_case)
    key = f"account:p/r:team=t{case}:month:2999-01"
    planes = [f"plane-{case}-{i}" for i in range(3)]
    rows = {p: LedgerRow() for p in planes}
    frames = dict.fromkeys(planes, 0)
    committed = dict.fromkeys(planes, 0)
    expected = Account()
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for seq, (p, new_frame, delta, liability, reserved, want, need, cap) in enumerate(
                beats):
            plane = planes[p]
            if new_frame:
                silence(conn, plane)
            frames[plane] += new_frame
            before = committed[plane]
            committed[plane] = max(0, committed[plane] + delta)
            report = Report(frame=str(frames[plane]), committed=committed[plane],
                            liability=liability, reserved=reserved)
            got = heartbeat(conn, plane=plane, key=key, frame=report.frame,
                            committed=report.committed, liability=liability,
                            reserved=reserved, want=want, need=need, cap=cap, limit=limit,
                            grant=grant, seq=seq)
            assert got["status"] == "ok"
            if seq == 0 and shared_reserved:
                conn.execute("UPDATE authority_accounts SET reserved = reserved + %s"
                             " WHERE key = %s", (shared_reserved, key))
            try:
                result = sync(rows[plane], report, expected, limit=limit, grant=grant,
                              want=want, need=need, cap=cap)
            except WentBackwards:
                committed[plane] = before
                assert [x["refused"] for x in got["refused"]] == ["went_backwards"]
                assert got["leases"] == []
                assert stored(conn, key, plane) == rows[plane]
                assert account(conn, key) == expected
                continue
            rows[plane], expected = result.row, result.account
            if seq == 0 and shared_reserved:
                expected = Account(committed=expected.committed, liability=expected.liability,
                                   reserved=shared_reserved,
                                   leased_outstanding=expected.leased_outstanding)
            (lease,) = got["leases"]
            assert lease["allowance"] == result.row.allowance
            assert stored(conn, key, plane) == result.row
            assert account(conn, key) == expected


def test_an_older_heartbeat_of_the_same_process_changes_nothing(pg_dsn: str) -> None:
    """A heartbeat that arrives after a newer one of the same process was applied (a late
    retry) is answered with the stored lease and moves no figure."""
    key = "account:p/r:team=late:month:2999-01"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        heartbeat(conn, plane="p", key=key, frame="f", committed=10, limit=1_000, grant=100,
                  seq=1)
        newer = heartbeat(conn, plane="p", key=key, frame="f", committed=50, limit=1_000,
                          grant=100, seq=2)
        before = (stored(conn, key, "p"), account(conn, key))
        late = heartbeat(conn, plane="p", key=key, frame="f", committed=10, limit=1_000,
                         grant=100, seq=1)
        assert late["status"] == "stale_heartbeat"
        assert late["leases"][0]["allowance"] == newer["leases"][0]["allowance"] == 150
        assert (stored(conn, key, "p"), account(conn, key)) == before
        # Another process (a restart with the same counter store) is applied.
        restarted = heartbeat(conn, plane="p", key=key, frame="f", committed=50, limit=1_000,
                              grant=100, seq=0, boot="b2")
        assert restarted["status"] == "ok"


def test_an_ended_window_takes_reports_but_no_grant(pg_dsn: str) -> None:
    """A report for a window the control plane's clock has left settles into it and keeps
    the allowance where it was; no new grant is made."""
    key = "account:p/r:team=old:day:2000-01-01"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        got = heartbeat(conn, plane="p", key=key, frame="f", committed=70, limit=1_000,
                        grant=100, seq=1, period="2000-01-01")
        lease = got["leases"][0]
        assert lease["open"] is False and lease["allowance"] == 70 and lease["grant"] == 0
        assert account(conn, key).committed == 70


def test_a_stale_generation_is_refused_before_any_figure_moves(pg_dsn: str) -> None:
    """Limits computed from another policy generation are refused (the caller reloads)."""
    key = "account:p/r:team=gen:month:2999-01"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        req = {"generation": 7, "dataplane": {"id": "p", "token_name": "t", "frame": "f",
                                              "boot": "b", "seq": 1},
               "accounts": [{"key": key, "rule_uid": "p/r", "scope": "team=gen",
                             "window": "month", "period": "2999-01", "limit": 10,
                             "grant": 10, "renew_ms": 1000, "committed": 5}]}
        got = conn.execute("SELECT inferplane_lease_sync_v1(%s::jsonb)",
                           (json.dumps(req),)).fetchone()
        assert got is not None and got[0]["status"] == "stale_generation"
        assert conn.execute("SELECT count(*) FROM authority_accounts WHERE key = %s",
                            (key,)).fetchone() == (0,)
