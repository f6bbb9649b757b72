"""Input the provider adds (previous responses, files, server tools) is bounded or refused,
and usage above the admitted bound never carries a hard limit past its cap."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import Stack, expected_cost

pytestmark = pytest.mark.e2e


def _chat(stack: Stack, key: str, model: str, **extra: object) -> httpx.Response:
    return httpx.post(f"{stack.gateway.url}/v1/chat/completions", timeout=30, json={
        "model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "go on"}],
        **extra}, headers={"Authorization": f"Bearer {key}"})


def test_unbounded_provider_side_input_is_refused_before_any_call(stack: Stack) -> None:
    """A request referencing provider-side input on a model without max_input_tokens: 400,
    naming the setting, and the upstream never sees it."""
    key = stack.team_key("bounds-refused", "--usd-micros-per-day", "50000000")
    stack.clear_ledger()
    r = _chat(stack, key, "gpt-hidden", previous_response_id="resp_1")
    assert r.status_code == 400, r.text
    assert "max_input_tokens" in r.json()["error"]["message"]
    assert stack.ledger() == []
    assert stack.team_usage(key)["requests"] == 0


def test_context_window_bound_covers_provider_side_input(stack: Stack) -> None:
    """With max_input_tokens the request is admitted under that bound and settles exactly."""
    key = stack.team_key("bounds-window", "--usd-micros-per-day", "500000000")
    stack.clear_ledger()
    r = _chat(stack, key, "gpt-hidden-windowed", previous_response_id="resp_1")
    assert r.status_code == 200, r.text
    assert int(r.headers["x-inferplane-token-bound"]) == 100_000 + 8
    [entry] = stack.ledger()
    assert int(r.headers["x-inferplane-cost-micro-usd"]) == expected_cost(entry)
    usage = stack.team_usage(key)
    assert usage["usd_committed"] == expected_cost(entry) and usage["usd_reserved"] == 0


def test_usage_above_the_bound_is_committed_and_nothing_freezes(stack: Stack) -> None:
    """An upstream reporting far more than the admitted bound (a model configured without
    its context window): the answer is relayed, the usage committed in full as the
    provider will invoice it, and the team is not frozen (DESIGN §5: bound_exceeded)."""
    key = stack.team_key("bounds-over", "--usd-micros-per-day", "50000000")
    r = _chat(stack, key, "gpt-hidden")
    assert r.status_code == 200, r.text
    cost = int(r.headers["x-inferplane-cost-micro-usd"])
    assert cost > int(r.headers["x-inferplane-usd-bound"])
    usage = stack.team_usage(key)
    assert usage["usd_committed"] == cost and usage["tokens_committed"] > 50_000
    assert _chat(stack, key, "gpt-up").status_code == 200
