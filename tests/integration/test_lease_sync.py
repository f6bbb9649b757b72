"""inferplaned's lease endpoints against a real migrated Postgres (Litestar test client):
``POST /v1alpha1/sync`` (the heartbeat) and ``GET /v1alpha1/dataplanes``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from litestar.testing import AsyncTestClient

from controlplane import create_app
from tests.integration._inferplaned import control_plane_config

pytestmark = pytest.mark.integration

WRITER = "w" * 8 + "-writer-token-1"
READER = "r" * 8 + "-reader-token-1"
PLANE = "d" * 8 + "-dataplane-token"
DAY_KEY = "account:spend/daily:team=alpha:day:{day}"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def budget_doc(*, limit_milli: int = 1_000, grant_milli: int = 100) -> dict[str, Any]:
    return {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
            "metadata": {"name": "spend"},
            "spec": {"rules": [{"name": "daily", "failurePolicy": "FailClosed",
                                "subject": {"kind": "team", "team": "*"},
                                "budget": {"limitMilliUSD": limit_milli, "window": "day",
                                           "lease": {"grant": grant_milli,
                                                     "renewInterval": "2s"}}}]}}


def heartbeat(*, seq: int = 1, fingerprint: str = "",
              accounts: list[dict[str, Any]] | None = None,
              rejections: list[dict[str, Any]] | None = None, plane: str = "node-a",
              frame: str = "frame-1", teams: tuple[str, ...] = ("alpha", "beta")
              ) -> dict[str, Any]:
    return {"dataplane": {"id": plane, "build": "test",
                          "api_versions": ["inferplane.dev/v1alpha1"]},
            "frame": frame, "boot": "boot-1", "seq": seq, "fingerprint": fingerprint,
            "applied_generation": 1, "rejections": rejections or [],
            "accounts": accounts or [], "teams": list(teams)}


@pytest.fixture
async def client(pg_dsn: str, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[AsyncTestClient[Any]]:
    config = control_plane_config(monkeypatch, pg_dsn, writers={"ci": WRITER},
                                  readers={"dash": READER}, planes={"nodes": PLANE})
    async with AsyncTestClient(app=create_app(config)) as c:
        r = await c.put("/v1alpha1/policies/spend", json=budget_doc(), headers=bearer(WRITER))
        assert r.status_code == 200, r.text
        yield c


async def sync(client: AsyncTestClient[Any], body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post("/v1alpha1/sync", json=body, headers=bearer(PLANE))
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


async def day_key(client: AsyncTestClient[Any]) -> str:
    return DAY_KEY.format(day=(await sync(client, heartbeat()))["day"])


async def test_each_token_tier_reaches_only_its_endpoints(client: AsyncTestClient[Any]) -> None:
    """A data plane token may sync but neither read nor publish policies; writer and
    reader tokens may not sync; without a token nothing is answered."""
    body = heartbeat()
    assert (await client.post("/v1alpha1/sync", json=body, headers=bearer(PLANE))
            ).status_code == 200
    for token in (WRITER, READER):
        r = await client.post("/v1alpha1/sync", json=body, headers=bearer(token))
        assert r.status_code == 403 and "data plane token" in r.json()["error"]["message"]
    assert (await client.post("/v1alpha1/sync", json=body)).status_code == 401
    for method, path in (("GET", "/v1alpha1/policies"), ("GET", "/v1alpha1/dataplanes"),
                         ("PUT", "/v1alpha1/policies/spend")):
        r = await client.request(method, path, json=budget_doc(), headers=bearer(PLANE))
        assert r.status_code == 403, (method, path)
    assert (await client.get("/v1alpha1/dataplanes", headers=bearer(READER))).status_code == 200


async def test_the_policy_pull_is_skipped_when_the_fingerprint_matches(
        client: AsyncTestClient[Any]) -> None:
    """The first heartbeat gets the published set; one that presents its fingerprint
    gets no documents, only the generation, windows and cadence."""
    first = await sync(client, heartbeat())
    assert set(first["documents"]) == {"spend"} and first["heartbeat_ms"] == 2000
    again = await sync(client, heartbeat(seq=2, fingerprint=first["fingerprint"]))
    assert again["documents"] is None and again["generation"] == first["generation"]


async def test_a_heartbeat_retried_after_a_lost_answer_grants_nothing_twice(
        client: AsyncTestClient[Any], pg_dsn: str) -> None:
    """The ledger committed a heartbeat whose answer was lost; the same heartbeat again,
    and a fresh one with the same figures, get the same allowance and move nothing."""
    key = await day_key(client)
    report = [{"key": key, "rule_uid": "spend/daily", "committed": 30_000, "reserved": 5_000}]
    first = await sync(client, heartbeat(seq=5, accounts=report))
    (lease,) = first["leases"]
    assert lease["allowance"] == 35_000 + 100_000 and lease["grant"] == 100_000

    def account() -> tuple[Any, ...]:
        with psycopg.connect(pg_dsn) as conn:
            row = conn.execute("SELECT committed, liability, reserved, leased_outstanding"
                               " FROM authority_accounts WHERE key = %s", (key,)).fetchone()
        assert row is not None
        return tuple(row)

    assert account() == (30_000, 0, 0, 105_000)
    for seq in (5, 6):  # the very same request, then the client's retry with a new seq
        again = await sync(client, heartbeat(seq=seq, accounts=report))
        assert again["leases"][0]["allowance"] == lease["allowance"]
        assert account() == (30_000, 0, 0, 105_000)


async def test_two_planes_share_one_budget_by_the_ledger_formula(
        client: AsyncTestClient[Any]) -> None:
    """remaining = limit − Σ spent − Σ outstanding of the others; allowance′ = spent +
    min(grant, remaining): the second plane gets only what the first leaves."""
    key = await day_key(client)
    a = await sync(client, heartbeat(plane="a", accounts=[
        {"key": key, "rule_uid": "spend/daily", "committed": 850_000}]))
    assert a["leases"][0]["allowance"] == 950_000
    b = await sync(client, heartbeat(plane="b", accounts=[
        {"key": key, "rule_uid": "spend/daily", "committed": 10_000}]))
    assert b["leases"][0]["allowance"] == 10_000 + 1_000_000 - 950_000 - 10_000
    assert b["leases"][0]["remaining"] == 0


async def test_reports_a_rule_could_not_have_made_are_ignored(
        client: AsyncTestClient[Any]) -> None:
    """A key that is not an account of the named rule, or a scope the rule's subject
    cannot charge, is answered in ``ignored`` and moves nothing."""
    r = await client.put("/v1alpha1/policies/one", headers=bearer(WRITER), json={
        **budget_doc(), "metadata": {"name": "one"},
        "spec": {"rules": [{"name": "daily", "failurePolicy": "FailClosed",
                            "subject": {"kind": "team", "team": "alpha"},
                            "budget": {"limitMilliUSD": 10, "window": "day"}}]}})
    assert r.status_code == 200, r.text
    day = (await sync(client, heartbeat()))["day"]
    answer = await sync(client, heartbeat(seq=2, accounts=[
        {"key": "not-an-account", "rule_uid": "one/daily", "committed": 1},
        {"key": f"account:one/daily:team=beta:day:{day}", "rule_uid": "one/daily",
         "committed": 1}]))
    assert answer["leases"] == []
    assert [i["reason"] for i in answer["ignored"]] == [
        "not an account key of rule 'one/daily'",
        "scope 'team=beta' is not one rule 'one/daily' applies to"]


async def test_dataplanes_shows_versions_generation_rejections_and_leases(
        client: AsyncTestClient[Any]) -> None:
    """Each plane that synced is listed with its API versions, applied generation,
    rejections, ledger rows and whether it is connected."""
    key = await day_key(client)
    rejection = {"name": "future", "problems": [{"path": "spec.rules[0].x", "message": "no"}]}
    await sync(client, heartbeat(seq=2, rejections=[rejection], accounts=[
        {"key": key, "rule_uid": "spend/daily", "committed": 7}]))
    r = await client.get("/v1alpha1/dataplanes", headers=bearer(READER))
    (plane,) = r.json()["dataplanes"]
    assert plane["id"] == "node-a" and plane["token_name"] == "nodes"
    assert plane["api_versions"] == ["inferplane.dev/v1alpha1"]
    assert plane["applied_generation"] == 1 and plane["rejections"] == [rejection]
    assert plane["connected"] is True and plane["heartbeats"] == 2
    (lease,) = plane["leases"]
    assert lease["account"] == key and lease["committed"] == 7
    assert lease["allowance"] == 7 + 100_000


async def test_a_malformed_heartbeat_is_400_naming_the_problem(
        client: AsyncTestClient[Any]) -> None:
    """A body that is not a sync request is refused with 400 and the failing field."""
    r = await client.post("/v1alpha1/sync", content=b'{"dataplane": {}}',
                          headers={**bearer(PLANE), "content-type": "application/json"})
    assert r.status_code == 400 and "dataplane" in r.json()["error"]["message"]
    bad = heartbeat(accounts=[{"key": "k", "rule_uid": "u", "committed": -1}])
    r = await client.post("/v1alpha1/sync", json=bad, headers=bearer(PLANE))
    assert r.status_code == 400 and "committed" in r.json()["error"]["message"]


async def test_a_publish_between_heartbeats_reaches_the_next_one(
        client: AsyncTestClient[Any]) -> None:
    """A generation published after the control plane compiled the previous one is what
    the next heartbeat gets (its stale limits are recomputed, never used)."""
    first = await sync(client, heartbeat())
    doc = {**budget_doc(limit_milli=5, grant_milli=5), "metadata": {"name": "more"}}
    doc["spec"]["rules"][0]["subject"] = {"kind": "team", "team": "beta"}
    r = await client.put("/v1alpha1/policies/more", json=doc, headers=bearer(WRITER))
    assert r.status_code == 200, r.text
    day = first["day"]
    key = f"account:more/daily:team=beta:day:{day}"
    again = await sync(client, heartbeat(seq=2, fingerprint=first["fingerprint"], accounts=[
        {"key": key, "rule_uid": "more/daily", "committed": 1_000}]))
    assert again["generation"] == first["generation"] + 1
    assert set(again["documents"]) == {"spend", "more"}
    (lease,) = again["leases"]
    assert lease["limit"] == 5_000 and lease["allowance"] == 5_000
