"""``mayu keys import`` carries the open month's spend: a cutover never grants a budget twice.

A local gateway (the real app factory, SQLite, a policy file, the built-in mock models)
serves requests for a team with day and month budgets, a key budget and a policy budget;
``mayu keys import`` runs as a real process; a shared gateway (the app factory on a
migrated Postgres, the same policy published there) must then show the key the same
windows in ``GET /v1/me`` as the local one did.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.app import create_app
from gateway.config import (
    Settings,
    load_settings,
)
from gateway.governance import (
    LocalGovernanceStore,
    Outcome,
    OutcomeKind,
    Permit,
    build_request,
)
from gateway.keys import KeyLimits, TeamLimits, hash_key
from gateway.policy._pgstore import publish
from tests.conftest import ROOT
from tests.integration._admin import SHARED_STORES
from tests.settling import settlement

pytestmark = pytest.mark.integration

BASE = load_settings(None)  # the built-in mock models
BODY = {"model": "mock-gpt", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
POLICY = {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
          "metadata": {"name": "p"},
          "spec": {"rules": [{"name": "daily", "failurePolicy": "FailClosed",
                              "subject": {"kind": "team", "team": "t"},
                              "budget": {"limitMilliUSD": 5_000, "window": "day",
                                         "hardCap": True}}]}}
CRASH_BOUND = 40_000
"""µUSD bound of the permit a 'crashed' local gateway leaves pending."""


def _local_settings(tmp: Path) -> Settings:
    policy = tmp / "p.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    (tmp / "local.yaml").write_text(yaml.safe_dump({"data_dir": str(tmp / ".mayu")}))
    return replace(BASE, data_dir=str(tmp / ".mayu"), demo=False, policies=[str(policy)])


def _shared_settings(tmp: Path) -> Settings:
    (tmp / "shared.yaml").write_text(yaml.safe_dump({
        "key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
        "database": {"dsn_ref": "env:INFERPLANE_DATABASE_URL"}}))
    return replace(BASE, data_dir=str(tmp / "shared"), demo=False, **SHARED_STORES)


@asynccontextmanager
async def _gateway(settings: Settings) -> AsyncIterator[tuple[AsyncTestClient[Any], Any]]:
    app = create_app(settings)
    async with AsyncTestClient(app=app) as client:
        yield client, app.state.gateway


def mayu(tmp: Path, dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFERPLANE_DATABASE_URL": dsn}
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=60)


def import_(tmp: Path, dsn: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return mayu(tmp, dsn, "keys", "import", "--from", str(tmp / ".mayu" / "mayu.db"),
                "--config", str(tmp / "shared.yaml"), *extra)


async def windows(client: AsyncTestClient[Any], key: str) -> dict[str, dict[str, Any]]:
    """GET /v1/me's calendar windows and policy accounts (buckets are not moved)."""
    me = await client.get("/v1/me", headers={"Authorization": f"Bearer {key}"})
    assert me.status_code == 200, me.text
    return {e["counter"]: {f: e[f] for f in ("limit", "committed", "liability", "reserved",
                                              "remaining", "period", "frozen")}
            for e in me.json()["limits"] if e["kind"] != "bucket"}


async def serve_locally(tmp: Path, requests: int) -> tuple[str, int]:
    """A local gateway: team ``t`` (day and month budgets), a key with a day budget and
    the policy budget; ``requests`` requests served. Returns the key and their cost."""
    async with _gateway(_local_settings(tmp)) as (c, gw):
        await gw.key_store.create_team(name="t", limits=TeamLimits(
            usd_micros_per_day=9_000_000, usd_micros_per_month=90_000_000,
            tokens_per_day=1_000_000))
        key, _ = await gw.key_store.create_key(team="t", user="ana", limits=KeyLimits(
            usd_micros_per_day=3_000_000))
        cost = 0
        for _ in range(requests):
            r = await c.post("/v1/chat/completions", json=BODY,
                             headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200, r.text
            cost += int(r.headers["x-inferplane-cost-micro-usd"])
    assert cost > 0
    return key, cost


async def crash_locally(tmp: Path, key: str, *, invalid: bool = False) -> str:
    """A request admitted by the local store, whose gateway then dies: its permit stays
    pending (or, ``invalid``, is settled with invalid upstream usage). Planned by the
    gateway (the key, its team and the policy as loaded), admitted by the store on the
    test's own event loop."""
    async with _gateway(_local_settings(tmp)) as (_, gw):
        principal = await gw.key_store.resolve(hash_key(key))
        snapshot = gw.policy.snapshot()
    req = build_request(principal, snapshot, request_id="crashed", model="mock-gpt",
                        token_bound=100, usd_bound=CRASH_BOUND, now=datetime.now(UTC))
    store = LocalGovernanceStore(str(tmp / ".mayu" / "mayu.db"))
    await store.open()
    try:
        [permit] = await store.admit([req])
        if invalid and isinstance(permit, Permit):
            await store.settle(permit.id, settlement(req, Outcome(
                kind=OutcomeKind.INVALID, detail="negative tokens")))
    finally:
        await store.close()
    assert isinstance(permit, Permit), permit
    return permit.id


async def local_windows(tmp: Path, key: str) -> dict[str, dict[str, Any]]:
    async with _gateway(_local_settings(tmp)) as (c, _):
        return await windows(c, key)


async def publish_policy(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await publish(conn, put={"p": POLICY}, author="test")


async def test_cutover_mid_day_keeps_every_remaining_budget(
        pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pending permit refuses the import (exit 2, one line, nothing imported); once
    resolved as uncertain, the import moves committed and liability so the shared gateway
    shows the key, team and policy windows exactly as the local one did (same committed,
    liability, remaining); a second import changes nothing."""
    monkeypatch.setenv("INFERPLANE_DATABASE_URL", pg_dsn)
    await publish_policy(pg_dsn)
    key, cost = await serve_locally(tmp_path, requests=3)
    crashed = await crash_locally(tmp_path, key)
    _shared_settings(tmp_path)

    refused = import_(tmp_path, pg_dsn)
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.strip().splitlines()[-1:]
    assert "1 pending permit(s)" in line and crashed in line and "nothing was imported" in line
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM teams").fetchone() == (0,)

    resolved = mayu(tmp_path, pg_dsn, "permits", "resolve", crashed, "--as", "uncertain",
                    "--config", str(tmp_path / "local.yaml"))
    assert resolved.returncode == 0, resolved.stderr
    before = await local_windows(tmp_path, key)
    team_day = next(v for k, v in before.items() if k.startswith("team:") and ":usd:day:" in k)
    assert (team_day["committed"], team_day["liability"]) == (cost, CRASH_BOUND)
    assert len(before) == 5  # key day, team day/month/tokens, policy account

    done = import_(tmp_path, pg_dsn, "--json")
    assert done.returncode == 0, done.stderr
    moved = json.loads(done.stdout)
    assert (moved["keys_added"], moved["dry_run"]) == (1, False)
    spend = moved["spend"]
    assert (spend["permits_added"], spend["permits_unchanged"]) == (4, 0)
    assert spend["counters_changed"] == 5
    [team] = spend["teams"]
    assert team["name"] == "t"
    assert team["day"] == team["month"] == {"committed": cost, "liability": CRASH_BOUND,
                                            "reserved": 0}

    async with _gateway(_shared_settings(tmp_path)) as (c, _):
        assert await windows(c, key) == before
        again = import_(tmp_path, pg_dsn, "--json")
        assert again.returncode == 0, again.stderr
        spend = json.loads(again.stdout)["spend"]
        assert (spend["permits_added"], spend["permits_unchanged"]) == (0, 4)
        assert (spend["counters_changed"], spend["teams"]) == (0, [])
        assert await windows(c, key) == before
        usage = (await c.get("/v1/usage", headers={"Authorization": f"Bearer {key}"})).json()
        day = next(u for u in usage["data"] if u["scope"] == "team" and u["window"] == "day")
        assert (day["usd_committed"], day["usd_liability"]) == (cost, CRASH_BOUND)


async def test_shared_spend_before_the_import_is_kept_and_local_added_once(
        pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared gateway already served the team (keys imported first): after the import
    each window holds its own spend plus the local spend, once; a dry run reports the same
    and writes nothing; the text output names the team's day and month figures."""
    monkeypatch.setenv("INFERPLANE_DATABASE_URL", pg_dsn)
    await publish_policy(pg_dsn)
    key, local_cost = await serve_locally(tmp_path, requests=2)
    _shared_settings(tmp_path)
    with sqlite3.connect(tmp_path / ".mayu" / "mayu.db") as conn:  # keys only, no spend
        conn.execute("ALTER TABLE gov_permits RENAME TO hidden")
    first = import_(tmp_path, pg_dsn, "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["spend"]["permits_added"] == 0
    with sqlite3.connect(tmp_path / ".mayu" / "mayu.db") as conn:
        conn.execute("ALTER TABLE hidden RENAME TO gov_permits")

    async with _gateway(_shared_settings(tmp_path)) as (c, _):
        r = await c.post("/v1/chat/completions", json=BODY,
                         headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        shared_cost = int(r.headers["x-inferplane-cost-micro-usd"])
        own = await windows(c, key)

        dry = import_(tmp_path, pg_dsn, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert dry.stdout.startswith("dry run, nothing written")
        assert f"committed {local_cost} µUSD, liability 0 µUSD; month" in dry.stdout
        assert await windows(c, key) == own

        done = import_(tmp_path, pg_dsn)
        assert done.returncode == 0, done.stderr
        assert "moved the spend of 2 permits" in done.stdout
        again = import_(tmp_path, pg_dsn)
        assert again.returncode == 0, again.stderr
        assert "moved the spend of 0 permits" in again.stdout
        after = await windows(c, key)
    assert after.keys() == own.keys()
    for counter, mine in own.items():
        if ":tokens:" in counter:  # the team's token quota: tokens, not µUSD
            assert after[counter]["committed"] > mine["committed"], counter
            continue
        assert mine["committed"] == shared_cost, counter
        assert after[counter]["committed"] == shared_cost + local_cost, counter
        assert after[counter]["remaining"] == mine["remaining"] - local_cost, counter


async def test_a_counter_its_permits_do_not_explain_refuses_the_import(
        pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local window holding more than its permits committed (a damaged file) refuses
    the import, exit 2, naming the counter and both figures; nothing is imported."""
    monkeypatch.setenv("INFERPLANE_DATABASE_URL", pg_dsn)
    key, cost = await serve_locally(tmp_path, requests=1)
    _shared_settings(tmp_path)
    with sqlite3.connect(tmp_path / ".mayu" / "mayu.db") as conn:
        [(counter,)] = conn.execute("SELECT counter FROM gov_counters WHERE counter LIKE "
                                    "'team:%:usd:day:%'").fetchall()
        conn.execute("UPDATE gov_counters SET committed = committed + 1 WHERE counter = ?",
                     (counter,))
    done = import_(tmp_path, pg_dsn)
    assert done.returncode == 2
    assert f"local counter {counter} holds committed/liability/reserved {cost + 1}/0/0 " \
           f"but the permits that charged it add up to {cost}/0/0" in done.stderr
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM keys").fetchone() == (0,)


async def test_an_invalid_permit_moves_with_its_reservation_and_freeze(
        pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local permit settled with invalid usage keeps its bound reserved and its money
    windows frozen in both stores: imported, the shared gateway shows the same windows
    (reserved, frozen, remaining) and `mayu accounts frozen` names the permit."""
    monkeypatch.setenv("INFERPLANE_DATABASE_URL", pg_dsn)
    await publish_policy(pg_dsn)
    key, _ = await serve_locally(tmp_path, requests=1)
    invalid = await crash_locally(tmp_path, key, invalid=True)
    before = await local_windows(tmp_path, key)
    money = {k: v for k, v in before.items() if ":tokens:" not in k}
    assert all(v["reserved"] == CRASH_BOUND and v["frozen"] for v in money.values()), money
    _shared_settings(tmp_path)
    done = import_(tmp_path, pg_dsn, "--json")
    assert done.returncode == 0, done.stderr
    spend = json.loads(done.stdout)["spend"]
    assert (spend["permits_added"], spend["invalid_permits"]) == (2, 1)
    assert spend["teams"][0]["day"]["reserved"] == CRASH_BOUND
    async with _gateway(_shared_settings(tmp_path)) as (c, _):
        assert await windows(c, key) == before
    frozen = mayu(tmp_path, pg_dsn, "accounts", "frozen", "--json",
                  "--config", str(tmp_path / "shared.yaml"))
    assert frozen.returncode == 0, frozen.stderr
    assert invalid in frozen.stdout.replace("-", "")
