"""Settlement latency and upstream time to first byte are exported as histograms.

Local profile through the real app factory; the in-process mock provider waits 50 ms
before its first byte (for a stream: after the headers, before the first event).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.config import ModelSettings, ProviderSettings, load_settings
from gateway.config._settings import Deployment
from gateway.keys import SqliteKeyStore
from gateway.pricing import ModelPrice

pytestmark = pytest.mark.integration


def _value(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    raise AssertionError(f"{name}{labels} not exported")


async def test_settlement_and_first_byte_histograms_move(tmp_path: Path) -> None:
    """A JSON answer and a stream each observe one settlement and one first byte; the
    stream's first byte comes 50 ms after its headers, and the histogram shows it."""
    keys = SqliteKeyStore(str(tmp_path / "mayu.db"))
    await keys.open()
    await keys.create_team(name="t")
    key, _ = await keys.create_key(team="t")
    await keys.close()
    base = load_settings(None)
    settings = msgspec.structs.replace(
        base, data_dir=str(tmp_path), demo=False,
        providers=[ProviderSettings(name="slow", kind="mock", latency_ms=50)],
        models=[ModelSettings(name="m", price=ModelPrice(input=1_000_000), deployments=[
            Deployment(provider="slow", upstream_model="mock-gpt")])])
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {key}"}
    app = create_app(settings)
    async with AsyncTestClient(app=app) as client:
        assert (await client.post("/v1/chat/completions", json=body,
                                  headers=headers)).status_code == 200
        r = await client.post("/v1/chat/completions", json={**body, "stream": True},
                              headers=headers)
        assert r.status_code == 200 and "[DONE]" in r.text
        # The answers left before the store took their settlements (timed when it has).
        assert await app.state.gateway.governor.caught_up()
        text = (await client.get("/metrics")).text
    assert _value(text, "mayu_settlement_seconds_count") == 2
    assert _value(text, "mayu_upstream_first_byte_seconds_count", provider="slow") == 2
    # Both first bytes waited 50 ms; the stream's headers did not (its first byte came
    # 50 ms after them), so first bytes took at least 50 ms more than headers in all.
    first = _value(text, "mayu_upstream_first_byte_seconds_sum", provider="slow")
    assert first >= 0.1
    assert first - _value(text, "mayu_upstream_seconds_sum", provider="slow") >= 0.045
