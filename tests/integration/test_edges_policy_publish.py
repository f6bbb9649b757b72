"""inferplaned's PUT refuses a lease ``renewInterval`` beyond 24h (issue 25).

inferplaned validates with ``gateway.policy``, so the bound ``mayu policy validate``
applies is the one a publish meets. Real migrated Postgres, Litestar's test client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from controlplane import create_app
from controlplane.settings import AuthSettings, ControlPlaneConfig
from gateway.config import DatabaseSettings

pytestmark = pytest.mark.integration

WRITER = "w" * 8 + "-writer-token-1"


def _doc(renew: str) -> dict[str, Any]:
    return {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
            "metadata": {"name": "spend"},
            "spec": {"rules": [{"name": "daily", "failurePolicy": "FailClosed",
                                "subject": {"kind": "team", "team": "platform"},
                                "budget": {"limitMilliUSD": 1000, "window": "day",
                                           "lease": {"grant": 10,
                                                     "renewInterval": renew}}}]}}


@pytest.fixture
async def client(pg_dsn: str, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[AsyncTestClient[Any]]:
    monkeypatch.setenv("IPD_EDGE_DSN", pg_dsn)
    monkeypatch.setenv("IPD_EDGE_WRITER", WRITER)
    config = ControlPlaneConfig(
        database=DatabaseSettings(dsn_ref="env:IPD_EDGE_DSN", pool_min_size=1,
                                  pool_max_size=2),
        auth=AuthSettings(writer_tokens_ref={"ci": "env:IPD_EDGE_WRITER"}))
    async with AsyncTestClient(app=create_app(config)) as c:
        yield c


async def test_put_refuses_a_renew_interval_above_24h_naming_the_field(
        client: AsyncTestClient[Any]) -> None:
    """PUT with ``renewInterval: 99999999999999999999h`` is a 422 whose one problem is
    at ``spend:spec.rules[0].budget.lease.renewInterval``; nothing is published; 24h
    itself is accepted."""
    auth = {"Authorization": f"Bearer {WRITER}"}
    r = await client.put("/v1alpha1/policies/spend", json=_doc("99999999999999999999h"),
                         headers=auth)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["problems"] == [
        {"path": "spend:spec.rules[0].budget.lease.renewInterval",
         "message": "must be at most 24h; got '99999999999999999999h'"}]
    assert (await client.get("/v1alpha1/policies/spend", headers=auth)).status_code == 404
    r = await client.put("/v1alpha1/policies/spend", json=_doc("24h"), headers=auth)
    assert r.status_code == 200, r.text
