"""The Presidio plug-in through the real app (``create_app``, local profile): loaded at
startup, its findings acted on in the request path like the built-ins' (block: the
client's 400, nothing admitted; mask: served), counted, and never written anywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.app import create_app
from gateway.guardrails import GuardrailSettings
from tests.integration._admin import gateway_settings
from tests.integration._inapp import in_app

CARD = "4111 1111 1111 1111"
EMAIL = "jane.doe@example.org"

GUARDRAILS = msgspec.convert({
    "enabled": True, "actions": {"card": "off", "email": "off"},
    "presidio": {"model": "blank", "failure": "closed", "timeout_s": 10,
                 "actions": {"CREDIT_CARD": "block"}}}, GuardrailSettings)
"""The built-in card and email detectors off: what acts is Presidio."""


async def test_presidio_blocks_and_masks_in_the_request_path(
        request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A card (Presidio: block) is a 400 guardrail_blocked naming presidio_credit_card;
    an email (Presidio: mask) is served; the metrics count both and the latency; no
    planted value is in an answer, the metrics, or any file of the gateway's data dir."""
    settings = gateway_settings(request, tmp_path, monkeypatch, profile="local")
    app = create_app(replace(settings, guardrails=GUARDRAILS))
    async with AsyncTestClient(app=app) as client:
        store = app.state.gateway.key_store
        in_app(client, store.create_team, name="t")
        key = in_app(client, store.create_key, team="t")[0]

        async def ask(text: str) -> Any:
            return await client.post(
                "/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                json={"model": "mock-gpt", "max_tokens": 8,
                      "messages": [{"role": "user", "content": text}]})
        blocked = await ask(f"charge {CARD} for the order")
        served = await ask(f"send the receipt to {EMAIL} please")
        metrics = (await client.get("/metrics")).text
    assert blocked.status_code == 400, blocked.text
    error = blocked.json()["error"]
    assert error["code"] == "guardrail_blocked" and "presidio_credit_card" in error["message"]
    assert served.status_code == 200, served.text
    assert ('mayu_guardrails_detected_total{action="mask",detector="presidio_email_address",'
            'direction="request"} 1.0') in metrics
    assert ('mayu_guardrails_blocked_total{detector="presidio_credit_card",'
            'direction="request"} 1.0') in metrics
    assert 'mayu_guardrails_presidio_seconds_count{outcome="ok"} 2.0' in metrics
    written = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    assert written, "the gateway wrote nothing to check"
    for value in (CARD, CARD.replace(" ", ""), EMAIL):
        for text in (blocked.text, served.text, metrics):
            assert value not in text
        assert not any(value.encode() in data for data in written)
