"""Fallbacks under a hard budget, three shared replicas on one Postgres database, with real
processes: the cheap deployment fails every request, each request falls back to a dearer
one, and every attempt is admitted at its own deployment's price before it is sent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from gateway.pricing import ModelPrice, Usage, cost_micro_usd
from tests.e2e._procs import Proc, run_cli, wait_none_pending
from tests.e2e._routing import routed_config, start_deployment, start_routed_gateway
from tests.e2e.conftest import PRICE

LIMIT = 1_000_000
DEAR = {cls: 5 * value for cls, value in PRICE.items()}
WORKERS, PER_WORKER = 6, 8
BODY = {"model": "claude-fb", "max_tokens": 20_000,
        "messages": [{"role": "user", "content": "lorem ipsum " * 3000}]}


@pytest.fixture
def replicas(tmp_path: Path, pg_dsn: str) -> Iterator[tuple[list[Proc], dict[str, Proc], Path]]:
    env = {"INFERPLANE_DATABASE_URL": pg_dsn}
    shared = {"key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
              "database": {"dsn_ref": "env:INFERPLANE_DATABASE_URL", "pool_min_size": 1,
                           "pool_max_size": 4}}
    providers = {"cheap": "anthropic", "dear": "anthropic"}
    upstreams: dict[str, Proc] = {}
    gateways: list[Proc] = []
    try:
        for name in providers:
            upstreams[name] = start_deployment(tmp_path, prompt_cache=False)
        model = {"name": "claude-fb",
                 "routing": {"strategy": "ordered", "cooldown_s": 0.001,
                             "max_cooldown_s": 0.001},
                 "deployments": [{"provider": "cheap", "upstream_model": "mock-claude"},
                                 {"provider": "dear", "upstream_model": "mock-claude",
                                  "price": DEAR}]}
        configs = [routed_config(tmp_path, upstreams, providers, [model], name=f"gw{i}",
                                 extra=shared) for i in range(3)]
        gateways += [start_routed_gateway(c, env) for c in configs]
        yield gateways, upstreams, configs[0]
    finally:
        for proc in [*gateways, *upstreams.values()]:
            proc.stop()


def _key(config: Path, env: dict[str, str]) -> tuple[str, str]:
    """A new team with the hard limit, and a key of it: (team id, key)."""
    team = run_cli("teams", "create", "fb", "--config", str(config), "--json",
                   "--usd-micros-per-day", str(LIMIT), env=env)
    assert team.returncode == 0, team.stderr
    made = run_cli("keys", "create", "--team", "fb", "--config", str(config), "--json",
                   env=env)
    assert made.returncode == 0, made.stderr
    return json.loads(team.stdout)["id"], json.loads(made.stdout)["key"]


def test_fallbacks_never_take_a_hard_budget_past_its_limit(
        replicas: tuple[list[Proc], dict[str, Proc], Path], pg_dsn: str) -> None:
    """Committed + liability stays within the limit; committed is exactly the dear
    upstream's record at its price (the failed cheap attempts cost nothing); a fallback
    whose bound no longer fits is refused, saying so, and never reaches its upstream."""
    gateways, upstreams, config = replicas
    env = {"INFERPLANE_DATABASE_URL": pg_dsn}
    team_id, key = _key(config, env)
    httpx.post(f"{upstreams['cheap'].url}/__mock/fail", json={"status": 503}).raise_for_status()
    answers: list[tuple[int, dict[str, Any], str]] = []
    lock = threading.Lock()

    def worker(w: int) -> None:
        with httpx.Client(timeout=120) as client:
            for i in range(PER_WORKER):
                gw = gateways[(w + i) % len(gateways)]
                r = client.post(f"{gw.url}/v1/messages", json=BODY,
                                headers={"x-api-key": key, "anthropic-version": "2023-06-01"})
                with lock:
                    answers.append((r.status_code, r.json(),
                                    r.headers.get("x-inferplane-request-id", "")))

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(worker, range(WORKERS)))
    wait_none_pending(pg_dsn, team_id=team_id)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        permits = {row[0]: row[1:] for row in conn.execute(
            "SELECT request_id, coalesce(usd_committed, 0), coalesce(usd_liability, 0), "
            "status FROM permits WHERE team_id = %s", (team_id,)).fetchall()}
    committed = sum(p[0] for p in permits.values())
    liability = sum(p[1] for p in permits.values())
    ok = [a for a in answers if a[0] == 200]
    refused = [a[1]["error"]["message"] for a in answers if a[0] == 402]
    dear = httpx.get(f"{upstreams['dear'].url}/__mock/ledger").json()
    cheap_failed = httpx.get(f"{upstreams['cheap'].url}/__mock/counts").json()["failed"]
    fell_back = [rid for _, _, rid in ok if f"{rid}.1" in permits]
    print(f"\n{len(ok)} answered ({len(fell_back)} after a fallback), {len(refused)} refused; "
          f"committed {committed} + liability {liability} of {LIMIT} µUSD")
    assert ok and refused, (len(ok), refused[:1])
    assert committed + liability <= LIMIT
    assert len(dear) == len(ok)  # a refused fallback never reached its upstream
    for rid in fell_back:  # every attempt in the request log under the request's id
        assert permits[rid][0] == 0 and permits[rid][2] == "complete"  # the 503 costs 0
        assert permits[f"{rid}.1"][0] > 0
    assert committed == sum(
        cost_micro_usd(Usage(**e["classes"]), ModelPrice(**DEAR)) for e in dear)
    assert fell_back and cheap_failed >= len(fell_back)
    assert any("the fallback to dear/mock-claude" in m and "was not tried" in m
               for m in refused), refused[:3]
