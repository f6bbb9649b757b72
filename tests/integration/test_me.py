"""``GET /v1/me``: a key holder sees every limit that binds it, with the store's figures.

Both profiles through the real app factory: the local one (SQLite, a policy file) and
the shared one (a migrated Postgres, the policy published in it). Litestar's in-process
client; the requests go to the built-in mock provider.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.app import create_app
from gateway.config import (
    load_settings,
)
from gateway.keys import KeyLimits, TeamLimits
from gateway.policy._pgstore import publish
from tests.integration._admin import SHARED_STORES
from tests.integration._inapp import in_app

pytestmark = pytest.mark.integration

BASE = load_settings(None)  # the built-in mock models

BODY = {"model": "mock-gpt", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
TEAM_DAY, TEAM_MONTH, KEY_DAY, RULE_DAY = 9_000_000, 90_000_000, 3_000_000, 5_000_000
POLICY = {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
          "metadata": {"name": "p"},
          "spec": {"rules": [{"name": "daily", "failurePolicy": "FailClosed",
                              "subject": {"kind": "team", "team": "t"},
                              "budget": {"limitMilliUSD": RULE_DAY // 1000,
                                         "window": "day", "hardCap": True}}]}}


@pytest.fixture(params=["local", "shared"])
async def gateway(request: pytest.FixtureRequest, tmp_path: Path
                  ) -> AsyncIterator[tuple[AsyncTestClient[Any], str, str]]:
    """A client of a fresh gateway; a key of team ``t`` (limited everywhere, a policy
    budget) and a key of team ``other`` (no limits)."""
    if request.param == "shared":
        pg_dsn = request.getfixturevalue("pg_dsn")
        request.getfixturevalue("monkeypatch").setenv("INFERPLANE_DATABASE_URL", pg_dsn)
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            await publish(conn, put={"p": POLICY}, author="test")
        settings = replace(BASE, data_dir=str(tmp_path), demo=False, **SHARED_STORES)
    else:
        policy = tmp_path / "p.yaml"
        policy.write_text(yaml.safe_dump(POLICY))
        settings = replace(BASE, data_dir=str(tmp_path), demo=False, policies=[str(policy)])
    app = create_app(settings)
    async with AsyncTestClient(app=app) as c:
        keys = app.state.gateway.key_store
        in_app(c, keys.create_team, name="t", limits=TeamLimits(
            rpm=100, usd_micros_per_day=TEAM_DAY, usd_micros_per_month=TEAM_MONTH))
        in_app(c, keys.create_team, name="other")
        limited, _ = in_app(c, keys.create_key, team="t", user="ana", limits=KeyLimits(
            rpm=5, usd_micros_per_day=KEY_DAY))
        free, _ = in_app(c, keys.create_key, team="other")
        yield c, limited, free


def _by_counter(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["counter"]: entry for entry in answer["limits"]}


async def test_a_key_sees_each_limit_that_binds_it_with_the_stores_figures(
        gateway: tuple[AsyncTestClient[Any], str, str]) -> None:
    """Before any request every window is empty with its limit as remaining; after one
    request the key's, the team's and the policy budget's day windows each hold its
    exact cost as committed (= /v1/usage's figure), remaining = limit - cost, the RPM
    buckets are one request down, and each window resets at the next UTC midnight (the
    month at the first of next month)."""
    c, key, _ = gateway
    auth = {"Authorization": f"Bearer {key}"}
    before = await c.get("/v1/me", headers=auth)
    assert before.status_code == 200, before.text
    me = before.json()
    assert me["object"] == "me" and me["team"]["name"] == "t" and me["user"] == "ana"
    limits = _by_counter(me)
    owners = sorted((e["owner"], e["dimension"], e["window"]) for e in limits.values())
    assert owners == [("key", "requests", "minute"), ("key", "usd", "day"),
                      ("policy", "usd", "day"), ("team", "requests", "minute"),
                      ("team", "usd", "day"), ("team", "usd", "month")]
    for entry in limits.values():
        assert entry["remaining"] == entry["limit"], entry

    r = await c.post("/v1/chat/completions", json=BODY, headers=auth)
    assert r.status_code == 200, r.text
    cost = int(r.headers["x-inferplane-cost-micro-usd"])
    assert cost > 0
    after = await c.get("/v1/me", headers=auth)
    assert after.status_code == 200, after.text
    now = datetime.now(UTC)
    midnight = (now + timedelta(days=1)).strftime("%Y-%m-%dT00:00:00Z")
    usage = (await c.get("/v1/usage", headers=auth)).json()["data"]
    team_day = next(u for u in usage if u["scope"] == "team" and u["window"] == "day")
    for entry in after.json()["limits"]:
        if entry["kind"] == "bucket":
            assert entry["remaining"] == entry["limit"] - 1, entry
            continue
        assert (entry["committed"], entry["liability"], entry["reserved"]) == (cost, 0, 0)
        assert entry["remaining"] == entry["limit"] - cost
        if entry["window"] == "day":
            assert entry["resets_at"] == midnight, entry
            assert entry["committed"] == team_day["usd_committed"]
        else:
            assert entry["resets_at"].endswith("-01T00:00:00Z"), entry
    assert {e["limit"] for e in after.json()["limits"] if e["kind"] != "bucket"} == {
        KEY_DAY, TEAM_DAY, TEAM_MONTH, RULE_DAY}


async def test_a_key_sees_only_itself_and_a_stranger_sees_nothing(
        gateway: tuple[AsyncTestClient[Any], str, str]) -> None:
    """Another team's key lists no limit of team t (its team has none, no rule applies);
    no key or a forged one is a 401 in the OpenAI error shape."""
    c, _, free = gateway
    r = await c.get("/v1/me", headers={"Authorization": f"Bearer {free}"})
    assert r.status_code == 200 and r.json()["limits"] == []
    assert r.json()["team"]["name"] == "other"
    for headers in ({}, {"Authorization": "Bearer sk-inf-forged"}):
        r = await c.get("/v1/me", headers=headers)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["type"] in ("authentication_error", "invalid_request_error")
