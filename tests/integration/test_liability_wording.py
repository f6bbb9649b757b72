"""Liability in words (issue 33): ``/v1/me`` and the 402 say it is the unobserved part of
the holder's own interrupted requests (how many), when it ends and who can resolve it.

Both profiles through the real app factory; the built-in mock provider, whose
``cut-stream`` model breaks every stream after its first events (an interrupted request:
its input commits, the rest of its bound is liability).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.app import create_app
from gateway.config import (
    Deployment,
    ModelSettings,
    load_settings,
)
from gateway.keys import TeamLimits
from tests.integration._admin import on_profile
from tests.integration._inapp import in_app

pytestmark = pytest.mark.integration

BASE = load_settings(None)
CUT = "mock-claude-cut-stream"
DAY = 60_000
BODY = {"model": CUT, "max_tokens": 4000, "stream": True,
        "messages": [{"role": "user", "content": "hello there " * 50}]}


@pytest.fixture(params=["local", "shared"])
async def gateway(request: pytest.FixtureRequest, tmp_path: Path
                  ) -> AsyncIterator[tuple[AsyncTestClient[Any], str]]:
    """A fresh gateway with a cut-stream model and a key of team ``small`` ($0.06/day)."""
    model = ModelSettings(name=CUT, deployments=[Deployment(provider="mock")],
                          price=BASE.models[1].price, max_output_tokens=8192)
    settings = replace(BASE, data_dir=str(tmp_path), demo=False,
                       models=[*BASE.models, model])
    app = create_app(on_profile(request, settings, request.param))
    async with AsyncTestClient(app=app) as c:
        keys = app.state.gateway.key_store
        in_app(c, keys.create_team, name="small",
               limits=TeamLimits(usd_micros_per_day=DAY))
        key, _ = in_app(c, keys.create_key, team="small")
        yield c, key


async def test_liability_says_whose_interrupted_requests_and_when_it_ends(
        gateway: tuple[AsyncTestClient[Any], str]) -> None:
    """Two cut streams leave liability on the team's day window: /v1/me's entry and the
    next 402 name the two interrupted requests, the reset and the operator's resolve."""
    client, key = gateway
    auth = {"x-api-key": key}
    for _ in range(2):
        async with client.stream("POST", "/v1/messages", json=BODY, headers=auth) as r:
            assert r.status_code == 200
            async for _chunk in r.aiter_bytes():
                pass
    me = (await client.get("/v1/me", headers=auth)).json()
    day = next(e for e in me["limits"] if e["owner"] == "team" and e["window"] == "day")
    assert day["liability"] > 0 and day["interrupted"] == 2, day
    note = day["liability_note"]
    assert (f"Its liability of {day['liability']} µUSD is the unobserved part of 2 of team "
            "'small''s own interrupted requests") in note, note
    assert f"resets at {day['resets_at'].replace('Z', '+00:00')}" in note
    assert "resolves those permits with the provider's figure" in note
    refused = await client.post("/v1/messages", json={**BODY, "stream": False, "max_tokens": 8192},
                                headers=auth)
    assert refused.status_code == 402, refused.text
    message = refused.json()["error"]["message"]
    assert "is the unobserved part of 2 of team 'small''s own interrupted" in message
