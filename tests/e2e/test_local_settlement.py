"""Charge what was used (DESIGN §5), with real processes and the real SDKs.

committed is what the upstream reported, liability the unobserved rest of an uncertain
outcome's bound, and nothing is charged for a request that never left the gateway.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.pricing import ModelPrice, Usage, cost_micro_usd
from tests.e2e.conftest import PRICE, Stack, expected_cost

pytestmark = pytest.mark.e2e


def _settled(stack: Stack, key: str, *, requests: int = 1) -> dict[str, Any]:
    """/v1/usage once nothing is reserved any more (settlement follows the response)."""
    end = time.monotonic() + 60
    while time.monotonic() < end:
        usage = stack.team_usage(key)
        if not usage["usd_reserved"] and usage["requests"] >= requests:
            return usage
        time.sleep(0.05)
    raise AssertionError(f"never settled: {stack.team_usage(key)}")


def _settlement_lines(stack: Stack, permit: str) -> list[dict[str, Any]]:
    return [a for a in stack.audit() if a.get("permit") == permit
            and a.get("event") == "settled"]


def test_upstream_cut_mid_stream_makes_both_sdks_raise(stack: Stack) -> None:
    """A stream the upstream breaks mid-way ends with the protocol's error event: the
    openai SDK (chat and responses) and the anthropic SDK raise instead of returning a
    truncated answer; committed + liability is the bound."""
    key = stack.team_key("cut-sdks", "--usd-micros-per-day", "100000000")
    oa = openai.OpenAI(base_url=f"{stack.gateway.url}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.APIError, match="stream cut") as err:
        for _ in oa.chat.completions.create(
                model="gpt-cut", max_tokens=50, stream=True,
                messages=[{"role": "user", "content": "tell me a story"}]):
            pass
    # The client is told the answer is incomplete, not which provider or transport broke.
    assert "up-openai" not in str(err.value) and "request " in str(err.value)
    with pytest.raises(openai.APIError, match="stream cut"):
        for _ in oa.responses.create(model="gpt-cut", max_output_tokens=50, stream=True,
                                     input="tell me a story"):
            pass
    an = anthropic.Anthropic(base_url=stack.gateway.url, api_key=key, max_retries=0)
    with pytest.raises(anthropic.APIError, match="stream cut"), an.messages.stream(
            model="claude-cut", max_tokens=50,
            messages=[{"role": "user", "content": "a story"}]) as s:
        for _ in s:
            pass
    usage = _settled(stack, key, requests=3)
    assert usage["usd_committed"] + usage["usd_liability"] > 0
    lines = [a for a in stack.audit() if a.get("team_id") and a.get("event") == "settled"
             and a.get("model") in ("gpt-cut", "claude-cut") and a.get("key_id")]
    for line in lines[-3:]:
        assert line["outcome"] == "uncertain" and "stream cut" in line["detail"]
        assert line["usd_committed"] + line["usd_liability"] == line["usd_bound"]


def test_client_cut_after_three_chunks_commits_the_observed_input_classes(stack: Stack) -> None:
    """An Anthropic stream the client leaves after three events: its message_start input
    and cache classes (and one output token per content event relayed) are committed,
    the rest of the bound is liability, and truth lies in between."""
    key = stack.team_key("client-cut", "--usd-micros-per-day", "100000000")
    body = {"model": "claude-slow", "max_tokens": 40, "stream": True,
            "system": [{"type": "text", "text": "You are terse. " * 40,
                        "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "a long story please"}]}
    events: list[bytes] = []
    with httpx.Client(base_url=stack.gateway.url, timeout=60) as client, \
            client.stream("POST", "/v1/messages", json=body,
                          headers={"x-api-key": key, "anthropic-version": "2023-06-01"}) as r:
        assert r.status_code == 200
        permit = r.headers["x-inferplane-permit"]
        usd_bound = int(r.headers["x-inferplane-usd-bound"])
        buffer = b""
        for chunk in r.iter_bytes():
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                events.append(event)
            if len(events) >= 3:
                break
    start = json.loads(events[0].split(b"data: ", 1)[1])
    u = start["message"]["usage"]
    input_classes = Usage(input=u["input_tokens"], cache_read=u["cache_read_input_tokens"],
                          cache_write_5m=u["cache_creation"]["ephemeral_5m_input_tokens"],
                          cache_write_1h=u["cache_creation"]["ephemeral_1h_input_tokens"])
    _settled(stack, key)
    [line] = _settlement_lines(stack, permit)
    assert line["outcome"] == "uncertain"
    price = ModelPrice(**PRICE)
    floor = cost_micro_usd(Usage(**{**_fields(input_classes), "output": 1}), price)
    assert line["usd_committed"] >= floor
    observed = line["usage"]
    assert (observed["input"], observed["cache_read"], observed["cache_write_5m"]) == (
        input_classes.input, input_classes.cache_read, input_classes.cache_write_5m)
    # the classes the audit line shows add up to what was committed (issue 33)
    assert sum(observed.values()) == line["tokens_committed"] > input_classes.total_tokens()
    assert line["usd_committed"] + line["usd_liability"] == usd_bound
    # The truth: what the mock would have reported had the stream run to its end.
    from gateway.mock._model import anthropic_classes

    truth = cost_micro_usd(Usage(**anthropic_classes(body).as_dict()), price)
    assert line["usd_committed"] <= truth <= line["usd_committed"] + line["usd_liability"]


def _fields(u: Usage) -> dict[str, int]:
    return {"input": u.input, "cache_read": u.cache_read, "cache_write_5m": u.cache_write_5m,
            "cache_write_1h": u.cache_write_1h}


def test_connection_refused_costs_nothing_and_its_retries_cost_nothing(stack: Stack) -> None:
    """Nothing left the gateway: each attempt (the SDK retries the 502) settles cancelled;
    committed and liability stay 0 and no request is counted."""
    key = stack.team_key("refused", "--usd-micros-per-day", "100000000")
    client = openai.OpenAI(base_url=f"{stack.gateway.url}/v1", api_key=key, max_retries=2)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="gpt-down", max_tokens=20,
                                       messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 502
    usage = stack.team_usage(key)
    assert (usage["usd_committed"], usage["usd_liability"], usage["usd_reserved"]) == (0, 0, 0)
    assert usage["requests"] == 0
    settled = [a for a in stack.audit() if a.get("model") == "gpt-down"
               and a.get("event") == "settled"]
    assert len(settled) >= 3 and {a["outcome"] for a in settled} == {"cancelled"}


def test_usage_above_the_bound_is_committed_in_full_without_freezing(stack: Stack) -> None:
    """Valid usage ~10% above the admitted bound: committed in full (what the provider
    invoices, priced from its ledger), a bound_exceeded event, and no freeze."""
    key = stack.team_key("over-bound", "--usd-micros-per-day", "100000000")
    stack.clear_ledger()
    client = openai.OpenAI(base_url=f"{stack.gateway.url}/v1", api_key=key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-over", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    [entry] = stack.ledger()
    tokens = sum(entry["classes"].values())
    assert tokens > int(raw.headers["x-inferplane-token-bound"]) * 1.05
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) == expected_cost(entry)
    usage = _settled(stack, key)
    assert usage["usd_committed"] == expected_cost(entry)
    [line] = [a for a in stack.audit() if a.get("permit") == raw.headers["x-inferplane-permit"]
              and a.get("event") == "settled"]
    assert line["bound_exceeded"] is True and line["outcome"] == "complete"
    again = client.chat.completions.create(model="gpt-up", max_tokens=5,
                                           messages=[{"role": "user", "content": "hi"}])
    assert again.choices  # not frozen
    metrics = httpx.get(f"{stack.gateway.url}/metrics").text
    assert 'mayu_bound_exceeded_total{model="gpt-over"} 1.0' in metrics
