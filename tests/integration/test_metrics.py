"""``/metrics`` carries what DESIGN §8 lists, and each series moves with the traffic.

Local profile through the real app factory (SQLite stores built from settings, the
built-in mock provider, a real policy file source), Litestar's in-process client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from litestar import Litestar
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.config import load_settings
from gateway.keys import SqliteKeyStore, TeamLimits

LIMIT = 10_000_000  # the team's day µUSD limit
BODY = {"model": "mock-gpt", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def _policy(limit_milli_usd: int) -> dict[str, Any]:
    return {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
            "metadata": {"name": "p"},
            "spec": {"rules": [{"name": "daily", "failurePolicy": "FailClosed",
                                "subject": {"kind": "team", "team": "poor"},
                                "budget": {"limitMilliUSD": limit_milli_usd,
                                           "window": "day", "hardCap": True}}]}}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[Litestar, dict[str, str], Path]]:
    keys = SqliteKeyStore(str(tmp_path / "mayu.db"))
    await keys.open()
    rich = await keys.create_team(name="rich", limits=TeamLimits(usd_micros_per_day=LIMIT))
    await keys.create_team(name="poor")
    plaintext = {"rich": (await keys.create_key(team="rich"))[0],
                 "poor": (await keys.create_key(team="poor"))[0], "rich_id": rich.id}
    await keys.close()
    policy = tmp_path / "policies" / "p.yaml"
    policy.parent.mkdir()
    # 1 milliUSD: a "poor" call allowing 1000 output tokens (4000 µUSD) is a 402.
    policy.write_text(yaml.safe_dump(_policy(1)))
    base = load_settings(None)
    # Real team ids and names as labels (not the default pseudonyms: test_metrics_bounds).
    server = msgspec.structs.replace(base.server, metrics_team_labels=True)
    settings = msgspec.structs.replace(base, data_dir=str(tmp_path), server=server,
                                       demo=False, policies=[str(policy)])
    yield create_app(settings), plaintext, policy


async def test_each_design_metric_appears_and_moves(
        gateway: tuple[Litestar, dict[str, str], Path]) -> None:
    """Admissions by outcome, reserved vs committed, admission and upstream latency,
    budget utilisation and policy sync errors are exported and move with traffic."""
    app, keys, policy = gateway
    async with AsyncTestClient(app=app) as client:
        before = (await client.get("/metrics")).text
        ok = await client.post("/v1/chat/completions", json=BODY,
                               headers={"Authorization": f"Bearer {keys['rich']}"})
        assert ok.status_code == 200
        cost = int(ok.headers["x-inferplane-cost-micro-usd"])
        refused = await client.post("/v1/chat/completions", json={**BODY, "max_tokens": 1000},
                                    headers={"Authorization": f"Bearer {keys['poor']}"})
        assert refused.status_code == 402
        policy.write_text("spec: [not, a, policy]\n")
        app.state.gateway.policy.reload()  # what the poll does: logs the rejection
        # The answer left before the store took its settlement (the settled series move
        # when it has): wait for it, as /v1/usage does.
        assert await app.state.gateway.governor.caught_up()
        after = (await client.get("/metrics")).text

    for name, labels in [("mayu_admissions_total", {"outcome": "admitted"}),
                         ("mayu_admissions_total", {"outcome": "refused_402"}),
                         ("mayu_settlements_total", {"kind": "complete"}),
                         ("mayu_admission_seconds_count", {}),
                         ("mayu_upstream_seconds_count", {"provider": "mock"}),
                         ("mayu_policy_sync_errors_total", {"kind": "rejected"})]:
        assert value(before, name, **labels) == 0, name
    assert value(after, "mayu_admissions_total", outcome="admitted") == 1
    assert value(after, "mayu_admissions_total", outcome="refused_402") == 1
    assert value(after, "mayu_settlements_total", kind="complete") == 1
    assert value(after, "mayu_admission_seconds_count") == 2
    assert value(after, "mayu_upstream_seconds_count", provider="mock") == 1
    assert value(after, "mayu_reserved_micro_usd_total") > cost > 0
    assert value(after, "mayu_committed_micro_usd_total") == cost
    assert value(after, "mayu_reserved_outstanding_micro_usd") == 0
    assert value(after, "mayu_budget_utilisation_ratio", team_id=keys["rich_id"],
                  team="rich") == pytest.approx(cost / LIMIT)
    assert value(after, "mayu_policy_sync_errors_total", kind="rejected") == 1


async def test_budget_utilisation_starts_from_the_days_usage(
        gateway: tuple[Litestar, dict[str, str], Path]) -> None:
    """Local profile: a restarted gateway's utilisation includes what the day already
    committed (seeded from the store), not just its own traffic."""
    app, keys, _ = gateway
    headers = {"Authorization": f"Bearer {keys['rich']}"}
    async with AsyncTestClient(app=app) as client:
        first = await client.post("/v1/chat/completions", json=BODY, headers=headers)
        cost = int(first.headers["x-inferplane-cost-micro-usd"])
    async with AsyncTestClient(app=app) as client:  # a new lifespan: a fresh process view
        second = await client.post("/v1/chat/completions", json=BODY, headers=headers)
        assert int(second.headers["x-inferplane-cost-micro-usd"]) == cost
        assert await app.state.gateway.governor.caught_up()  # its settlement trails it
        text = (await client.get("/metrics")).text
    assert value(text, "mayu_budget_utilisation_ratio", team_id=keys["rich_id"],
                 team="rich") == pytest.approx(2 * cost / LIMIT)
