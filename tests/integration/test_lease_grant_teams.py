"""A data-plane token granted some teams reports only their consumption (issue 34).

inferplaned on a real migrated Postgres (Litestar test client): a plane bound to its
token (``planes: [node-a]``, ``teams: [alpha]``) that reports 999,000 µUSD for team beta
(listing beta among its heartbeat's teams) is refused for that account — told why,
counted (``inferplaned_lease_account_refusals{reason="not_granted"}``), logged as an
ALARM — and beta's budget is untouched, while its own team's report is adopted as before.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from litestar.testing import AsyncTestClient

from controlplane import create_app
from tests.integration._inferplaned import control_plane_config
from tests.integration.test_lease_trust_sync import (
    NODE_A,
    READER,
    WRITER,
    bearer,
    beat,
    budget_doc,
    report,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def client(pg_dsn: str, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[AsyncTestClient[Any]]:
    """inferplaned with node-a's token granted team alpha only, and the budget rule."""
    config = control_plane_config(
        monkeypatch, pg_dsn, writers={"ci": WRITER}, readers={"dash": READER},
        planes={"nodes-a": (NODE_A, {"planes": ["node-a"], "teams": ["alpha"]})})
    async with AsyncTestClient(app=create_app(config)) as c:
        r = await c.put("/v1alpha1/policies/spend", json=budget_doc(), headers=bearer(WRITER))
        assert r.status_code == 200, r.text
        yield c


def _committed(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT key, committed FROM authority_accounts").fetchall()
    return {key: committed for key, committed in rows}


async def test_a_report_beyond_the_tokens_teams_is_refused_and_alerted(
        client: AsyncTestClient[Any], pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """node-a (granted alpha) reports 999,000 µUSD for beta and 10 for alpha: beta's
    report is ignored with a reason, never reaches the ledger, is counted as not_granted
    and logged as an ALARM; alpha's is adopted."""
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    beta = report(day, committed=999_000, team="beta")
    alpha = report(day, committed=10, want=20, team="alpha")
    caplog.set_level(logging.WARNING, logger="inferplaned")
    r = await client.post("/v1alpha1/sync", headers=bearer(NODE_A), json=beat(
        accounts=[beta, alpha], teams=("alpha", "beta")))
    assert r.status_code == 200, r.text
    answer = r.json()
    (ignored,) = answer["ignored"]
    assert ignored["key"] == beta["key"] and "may report for" in ignored["reason"]
    ledger = _committed(pg_dsn)
    assert beta["key"] not in ledger and ledger[alpha["key"]] == 10
    assert [lease["key"] for lease in answer["leases"]] == [alpha["key"]]
    metrics = (await client.get("/metrics", headers=bearer(READER))).text
    assert 'inferplaned_lease_account_refusals_total{reason="not_granted"} 1.0' in metrics
    alarms = [rec for rec in caplog.records if "ALARM" in rec.getMessage()]
    assert len(alarms) == 1 and alarms[0].levelno == logging.ERROR
    assert "nodes-a" in alarms[0].getMessage() and beta["key"] in alarms[0].getMessage()
