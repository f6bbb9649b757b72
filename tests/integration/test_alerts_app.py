"""Budget alerts through the real local-profile app: settlements → events → webhook.

The app is built by the real factory from settings (SQLite stores, the in-process mock
provider answering without usage, so every permit settles uncertain and keeps its whole
bound as liability: a budget of 10 bounds is reached exactly). A real HTTP server takes
the webhook deliveries. A restart on the same data dir never delivers an event again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.config import AlertSettings, ModelSettings, ProviderSettings, load_settings
from gateway.config._settings import Deployment, Settings
from gateway.keys import SqliteKeyStore, TeamLimits
from gateway.pricing import ModelPrice
from tests.webhook import WebhookReceiver

pytestmark = pytest.mark.integration

SECRET = "alert-secret"
PRICE = ModelPrice(input=1_000_000, output=4_000_000)
BODY = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}


def _settings(tmp_path: Path, hook: str) -> Settings:
    base = load_settings(None)
    server = msgspec.structs.replace(
        base.server, metrics_team_labels=True,
        alerts=AlertSettings(webhook_url=hook, secret_ref="env:MAYU_TEST_ALERT_SECRET",
                             retry_backoff_s=0.05))
    return msgspec.structs.replace(
        base, data_dir=str(tmp_path), server=server, demo=False,
        providers=[ProviderSettings(name="mock", kind="mock")],
        models=[ModelSettings(name="m", price=PRICE, deployments=[
            Deployment(provider="mock", upstream_model="mock-missing-usage")])])


async def _key(tmp_path: Path, usd_per_day: int) -> tuple[str, str]:
    keys = SqliteKeyStore(str(tmp_path / "mayu.db"))
    await keys.open()
    team = await keys.create_team(name="spender",
                                  limits=TeamLimits(usd_micros_per_day=usd_per_day))
    plaintext, _ = await keys.create_key(team="spender")
    await keys.close()
    return team.id, plaintext


def _metric(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


async def _calls(settings: Settings, key: str, n: int) -> list[int]:
    statuses = []
    async with AsyncTestClient(app=create_app(settings)) as client:
        for _ in range(n):
            r = await client.post("/v1/chat/completions", json=BODY,
                                  headers={"Authorization": f"Bearer {key}"})
            statuses.append(r.status_code)
    return statuses


async def _bound(tmp_path: Path, settings: Settings) -> int:
    """The µUSD bound of one BODY request (the same for every one of them)."""
    _, key = await _key(tmp_path / "probe", 10**12)
    probe = msgspec.structs.replace(settings, data_dir=str(tmp_path / "probe"))
    async with AsyncTestClient(app=create_app(probe)) as client:
        r = await client.post("/v1/chat/completions", json=BODY,
                              headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200
    return int(r.headers["x-inferplane-usd-bound"])


async def test_thresholds_deliver_once_each_across_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A team day budget of 10 bounds: the 8th settlement emits the 80 % event (signed
    webhook, metric, audit line); after a restart the 9th and 10th emit 90 and 100 %
    and the 80 % event is not delivered again; the 11th request is refused (402)."""
    monkeypatch.setenv("MAYU_TEST_ALERT_SECRET", SECRET)
    with WebhookReceiver() as hook:
        settings = _settings(tmp_path, hook.url)
        bound = await _bound(tmp_path, settings)
        team_id, key = await _key(tmp_path, 10 * bound)
        async with AsyncTestClient(app=create_app(settings)) as client:
            for _ in range(8):
                r = await client.post("/v1/chat/completions", json=BODY,
                                      headers={"Authorization": f"Bearer {key}"})
                assert r.status_code == 200
            [first] = await hook.until(1)
            metrics = (await client.get("/metrics")).text
        assert _metric(metrics, "mayu_budget_alerts_total", threshold="80") == 1
        assert _metric(metrics, "mayu_budget_alert_deliveries_total", result="delivered") == 1
        assert await _calls(settings, key, 3) == [200, 200, 402]
        received = hook.received
    assert [r.json()["threshold"] for r in received] == [80, 90, 100]
    assert all(r.signed_with(SECRET) for r in received)
    event = first.json()
    counter = f"team:{team_id}:usd:day:{event['window']}"
    assert event["counter"] == counter and event["scope"] == "team"
    assert (event["committed"], event["liability"], event["limit"]) == (0, 8 * bound,
                                                                        10 * bound)
    audit = [json.loads(line) for path in tmp_path.glob("audit-*.jsonl")
             for line in path.read_text().splitlines()]
    alerts: list[dict[str, Any]] = [a for a in audit if a.get("event") == "budget_alert"]
    assert sorted(a["threshold"] for a in alerts) == [80, 90, 100]
    assert all(a["counter"] == counter for a in alerts)
