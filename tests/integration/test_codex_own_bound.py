"""Codex on a $1/day team that has spent nothing (issue 33): its Responses request names
no output limit, so its bound is gpt-6.2-sol's 128k ceiling, more than the whole limit.

Both profiles through the real app factory, the request as Codex sends it (its
User-Agent, ``input`` items, a function tool, no ``max_output_tokens``), the built-in mock
provider serving ``gpt-6.2-sol``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from litestar.testing import AsyncTestClient

from gateway.app import create_app
from gateway.config import (
    load_settings,
)
from gateway.keys import TeamLimits
from tests.integration._admin import on_profile
from tests.integration._inapp import in_app

pytestmark = pytest.mark.integration

MODEL = "gpt-6.2-sol"
CODEX = {"user-agent": "codex_exec/0.171.0 (Debian 12; x86_64) xterm-256color"}
TURN = {"model": MODEL, "stream": False, "store": False,
        "instructions": "You are Codex, a coding agent running in a terminal. " * 10,
        "input": [{"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "say ok"}]}],
        "tools": [{"type": "function", "name": "shell", "description": "Run a command",
                   "parameters": {"type": "object", "properties": {
                       "command": {"type": "array", "items": {"type": "string"}}}}}]}


@pytest.fixture(params=["local", "shared"])
async def client(request: pytest.FixtureRequest, tmp_path: Path
                 ) -> AsyncIterator[tuple[AsyncTestClient[Any], dict[str, str]]]:
    """A fresh gateway serving gpt-6.2-sol (catalog figures) from the mock; keys of a
    $1/day team without budget fit (``plain``) and one with it (``fit``)."""
    config = tmp_path / "mayu.yaml"  # a catalog model: its figures come from the catalog
    config.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path), "demo": False,
        "providers": [{"name": "mock", "kind": "mock"}],
        "models": [{"name": MODEL, "deployments": [{"provider": "mock"}]}]}))
    settings = load_settings(str(config))
    app = create_app(on_profile(request, settings, request.param))
    async with AsyncTestClient(app=app) as c:
        keys = app.state.gateway.key_store
        in_app(c, keys.create_team, name="plain",
               limits=TeamLimits(usd_micros_per_day=1_000_000))
        in_app(c, keys.create_team, name="fit",
               limits=TeamLimits(usd_micros_per_day=1_000_000, budget_fit_floor=1024))
        plain, _ = in_app(c, keys.create_key, team="plain")
        fit, _ = in_app(c, keys.create_key, team="fit")
        yield c, {"plain": plain, "fit": fit}


async def test_codex_is_told_what_fits_never_that_its_usage_limit_is_hit(
        client: tuple[AsyncTestClient[Any], dict[str, str]]) -> None:
    """Nothing spent, a worst case above the whole limit: a 400 invalid_request naming
    max_output_tokens and the largest that fits (no usage_limit_reached, no reset); the
    same request with that limit is admitted."""
    c, keys = client
    r = await c.post("/v1/responses", json=TURN,
                     headers={**CODEX, "authorization": f"Bearer {keys['plain']}"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and "resets_at" not in error
    assert error["param"] == "max_output_tokens"
    assert "Nothing is spent" in error["message"]
    fits = int(error["message"].split("Set max_output_tokens <= ")[1].split(":")[0])
    assert 90_000 < fits < 128_000
    ok = await c.post("/v1/responses", json={**TURN, "max_output_tokens": fits},
                      headers={**CODEX, "authorization": f"Bearer {keys['plain']}"})
    assert ok.status_code == 200, ok.text


async def test_budget_fit_admits_a_responses_request_that_names_no_limit(
        client: tuple[AsyncTestClient[Any], dict[str, str]]) -> None:
    """With the team's budget fit on, the same request is admitted with the largest
    max_output_tokens that fits written into it, and the answer says so."""
    c, keys = client
    r = await c.post("/v1/responses", json=TURN,
                     headers={**CODEX, "authorization": f"Bearer {keys['fit']}"})
    assert r.status_code == 200, r.text
    fitted = r.headers["x-inferplane-budget-fit"]
    assert fitted.startswith("max_tokens lowered from 128000 to "), fitted
    assert int(r.headers["x-inferplane-usd-bound"]) <= 1_000_000
