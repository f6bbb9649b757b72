"""The mock model: deterministic usage, every cache class, always within the gateway bound."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.mock import plan_reply
from gateway.mock._model import anthropic_classes, openai_classes


def _total(classes: dict[str, int]) -> int:
    return sum(classes.values())


texts = st.text(max_size=400)


@settings(max_examples=200, deadline=None)
@given(texts, st.integers(min_value=0, max_value=500), st.booleans(),
       st.sampled_from(["5m", "1h", None]))
def test_mock_usage_never_exceeds_body_bytes_plus_max_tokens(
        text: str, max_tokens: int, cached: bool, ttl: str | None) -> None:
    """Every class summed stays within len(body) + max_tokens, for both protocols."""
    block: dict[str, object] = {"type": "text", "text": text}
    if cached:
        block["cache_control"] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    for model in ("m", "m-no-ttl"):
        body = {"model": model, "max_tokens": max_tokens, "system": [block],
                "messages": [{"role": "user", "content": text}]}
        size = len(json.dumps(body).encode())
        assert _total(anthropic_classes(body).as_dict()) <= size + max_tokens
        assert _total(openai_classes(body).as_dict()) <= size + max_tokens
        assert anthropic_classes(body).output <= max_tokens


def test_mock_usage_is_a_pure_function_of_the_body() -> None:
    """The same body always reports the same usage."""
    body = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "x" * 300}]}
    first, second = plan_reply("chat", body), plan_reply("chat", body)
    assert first.entry and second.entry
    assert first.entry["usage"] == second.entry["usage"]
    assert first.entry["classes"]["cache_read"] > 0


def test_mock_reports_1h_and_5m_cache_writes_by_ttl() -> None:
    """A cache_control block with ttl 1h is written to the 1h class, else 5m."""
    def body(ttl: str | None) -> dict[str, object]:
        cc = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
        return {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "y" * 200, "cache_control": cc}]}]}
    one_hour, five_min = anthropic_classes(body("1h")), anthropic_classes(body(None))
    assert one_hour.cache_write_1h > 0 and one_hour.cache_write_5m == 0
    assert five_min.cache_write_5m > 0 and five_min.cache_write_1h == 0
    assert one_hour.cache_read > 0


def test_no_ttl_model_omits_the_split() -> None:
    """mock-no-ttl reports cache_creation_input_tokens without the 5m/1h split."""
    reply = plan_reply("messages", {"model": "mock-no-ttl", "max_tokens": 5,
                                    "messages": [{"role": "user", "content": "z" * 80}]})
    assert reply.entry is not None
    usage = reply.entry["usage"]
    assert usage["cache_creation_input_tokens"] > 0 and "cache_creation" not in usage


def test_misbehaving_models() -> None:
    """negative-usage, missing-usage and error-500 do what their names say."""
    msg = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 9}
    neg = plan_reply("chat", {**msg, "model": "mock-negative-usage"})
    assert json.loads(neg.body or b"")["usage"]["completion_tokens"] < 0
    missing = plan_reply("chat", {**msg, "model": "mock-missing-usage"})
    assert "usage" not in json.loads(missing.body or b"")
    assert plan_reply("messages", {**msg, "model": "mock-error-500"}).status == 500
