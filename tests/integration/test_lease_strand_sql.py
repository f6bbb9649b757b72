"""An expired lease's unused allowance goes back to the budget when its plane reports
again (issue 25, item 2), in ``sql/lease.sql`` exactly as in gateway.lease._ledger:
the allowance restarts from what the plane holds, then takes a normal grant, instead of
staying parked until the window ends."""

from __future__ import annotations

import psycopg
import pytest

from gateway.lease._ledger import Account, LedgerRow, Report, sync
from tests.integration.test_lease_sql import account, heartbeat, stored

pytestmark = pytest.mark.integration


def test_an_expired_lease_returns_its_unused_allowance(pg_dsn: str) -> None:
    """A plane granted a large want (510) whose lease then expired reports held 20: its
    allowance becomes 20 + one grant (120), the account's leased sum drops by the rest,
    and the SQL and the Python arithmetic agree; a valid lease keeps its allowance."""
    key = "account:p/r:team=idle:month:2999-01"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        heartbeat(conn, plane="p", key=key, frame="f", committed=10, limit=10_000,
                  grant=100, want=500, seq=1)
        row = stored(conn, key, "p")
        assert row.allowance == 510 and account(conn, key).leased_outstanding == 500
        heartbeat(conn, plane="p", key=key, frame="f", committed=15, limit=10_000,
                  grant=100, seq=2)
        valid, mid = stored(conn, key, "p"), account(conn, key)
        assert valid.allowance == 510  # still valid: kept
        conn.execute("UPDATE lease_grants SET expires_at = now() - interval '1 second'"
                     " WHERE account = %s", (key,))
        got = heartbeat(conn, plane="p", key=key, frame="f", committed=20, limit=10_000,
                        grant=100, seq=3)
        assert got["leases"][0]["allowance"] == 120
        assert account(conn, key).leased_outstanding == 100
        expected = sync(valid, Report(frame="f", committed=20), mid, limit=10_000,
                        grant=100, expired=True)
        assert stored(conn, key, "p") == expected.row and account(conn, key) == expected.account
    kept = sync(LedgerRow(frame="f", committed=15, allowance=510),
                Report(frame="f", committed=20), Account(), limit=10_000, grant=100)
    assert kept.row.allowance == 510
