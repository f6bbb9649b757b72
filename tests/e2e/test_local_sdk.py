"""The real openai and anthropic SDKs through a real gateway in front of real upstreams."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import Stack, expected_cost

pytestmark = pytest.mark.e2e

LONG = "The quick brown fox jumps over the lazy dog. " * 8


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    return stack.team_key("sdk")


def _only_entry(stack: Stack) -> dict[str, object]:
    entries = stack.ledger()
    assert len(entries) == 1, entries
    return entries[0]


def test_chat_completion_cost_header_matches_upstream_ledger(stack: Stack,
                                                             oai: openai.OpenAI) -> None:
    """A chat completion's cost header equals the price of what the upstream reported."""
    stack.clear_ledger()
    raw = oai.chat.completions.with_raw_response.create(
        model="gpt-up", max_tokens=20, messages=[{"role": "user", "content": LONG}])
    completion = raw.parse()
    entry = _only_entry(stack)
    assert entry["classes"]["cache_read"] > 0  # type: ignore[index]
    assert completion.usage is not None
    details = completion.usage.prompt_tokens_details
    assert details is not None and (details.cached_tokens or 0) > 0
    assert completion.model == "mock-gpt"
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) == expected_cost(entry)
    assert raw.headers["x-inferplane-permit"]


def test_chat_stream_without_include_usage_shows_no_usage_chunk(stack: Stack,
                                                                oai: openai.OpenAI) -> None:
    """Streaming chat without include_usage: the client never sees a usage-only chunk."""
    chunks = list(oai.chat.completions.create(
        model="gpt-up", max_tokens=12, stream=True,
        messages=[{"role": "user", "content": "hello there"}]))
    assert chunks
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks).startswith("w0")


def test_chat_stream_with_include_usage_keeps_it(stack: Stack, oai: openai.OpenAI) -> None:
    """A client that asks for stream usage gets the upstream's usage chunk unchanged."""
    stack.clear_ledger()
    chunks = list(oai.chat.completions.create(
        model="gpt-up", max_tokens=12, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": LONG}]))
    entry = _only_entry(stack)
    usage_chunks = [c for c in chunks if not c.choices]
    assert len(usage_chunks) == 1 and usage_chunks[0].usage is not None
    assert usage_chunks[0].usage.completion_tokens == entry["classes"]["output"]  # type: ignore[index]


def test_responses_api_json_and_stream(stack: Stack, oai: openai.OpenAI, key: str) -> None:
    """Responses API, plain and streamed: each charged exactly the ledger's price."""
    stack.clear_ledger()
    raw = oai.responses.with_raw_response.create(model="gpt-up", input=LONG,
                                                 max_output_tokens=16)
    response = raw.parse()
    assert response.output_text.startswith("w0")
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) == expected_cost(_only_entry(stack))
    before = stack.team_usage(key)
    stack.clear_ledger()
    events = list(oai.responses.create(model="gpt-up", input=LONG, max_output_tokens=16,
                                       stream=True))
    assert events[-1].type == "response.completed"
    after = stack.team_usage(key)
    assert after["usd_committed"] - before["usd_committed"] == expected_cost(_only_entry(stack))


def test_embeddings_cost_header_matches_ledger(stack: Stack, oai: openai.OpenAI) -> None:
    """Embeddings (the SDK asks for base64) are priced from the upstream's report."""
    stack.clear_ledger()
    raw = oai.embeddings.with_raw_response.create(model="gpt-up", input=["a b c", LONG])
    result = raw.parse()
    assert len(result.data) == 2 and len(result.data[0].embedding) == 8
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) == expected_cost(_only_entry(stack))


def test_anthropic_messages_with_cache_classes(stack: Stack,
                                               claude: anthropic.Anthropic) -> None:
    """Messages with 5m and 1h cache blocks: every class priced, equal to the ledger price."""
    stack.clear_ledger()
    raw = claude.messages.with_raw_response.create(
        model="claude-up", max_tokens=20,
        system=[{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": LONG + "!",
                 "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        messages=[{"role": "user", "content": "hi"}])
    message = raw.parse()
    entry = _only_entry(stack)
    classes = entry["classes"]
    assert classes["cache_write_5m"] > 0 and classes["cache_write_1h"] > 0  # type: ignore[index]
    assert message.usage.cache_read_input_tokens == classes["cache_read"]  # type: ignore[index]
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) == expected_cost(entry)


def test_anthropic_stream_settles_at_ledger_price(stack: Stack,
                                                  claude: anthropic.Anthropic,
                                                  key: str) -> None:
    """A streamed message settles complete at exactly the ledger's price (via /v1/usage)."""
    before = stack.team_usage(key)
    stack.clear_ledger()
    with claude.messages.stream(model="claude-up", max_tokens=24,
                                messages=[{"role": "user", "content": LONG}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text.startswith("w0") and final.usage.output_tokens > 0
    entry = _only_entry(stack)
    after = stack.team_usage(key)
    assert after["usd_committed"] - before["usd_committed"] == expected_cost(entry)
    assert after["usd_reserved"] == before["usd_reserved"] == 0


def test_in_process_mock_kind_serves_both_protocols(oai: openai.OpenAI,
                                                    claude: anthropic.Anthropic) -> None:
    """The built-in mock provider answers both protocols, plain and streamed."""
    raw = oai.chat.completions.with_raw_response.create(
        model="gpt-local", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert raw.parse().usage.completion_tokens <= 5  # type: ignore[union-attr]
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) > 0
    streamed = list(oai.chat.completions.create(
        model="gpt-local", max_tokens=5, stream=True,
        messages=[{"role": "user", "content": "hi"}]))
    assert streamed and all(c.choices for c in streamed)
    message = claude.messages.create(model="claude-local", max_tokens=5,
                                     messages=[{"role": "user", "content": "hi"}])
    assert message.usage.output_tokens <= 5


def test_count_tokens_is_local(stack: Stack, claude: anthropic.Anthropic) -> None:
    """count_tokens answers without calling the upstream."""
    stack.clear_ledger()
    counted = claude.messages.count_tokens(model="claude-up",
                                           messages=[{"role": "user", "content": "x" * 400}])
    assert counted.input_tokens == 100
    assert stack.ledger() == []


def test_models_list(oai: openai.OpenAI) -> None:
    """/v1/models lists the configured models."""
    names = {m.id for m in oai.models.list()}
    assert {"gpt-up", "claude-up", "gpt-local"} <= names


def test_fallback_to_next_deployment_on_upstream_500(stack: Stack, oai: openai.OpenAI,
                                                     key: str) -> None:
    """A 500 from the first deployment falls back to the next; only the success is charged."""
    before = stack.team_usage(key)
    stack.clear_ledger()
    raw = oai.chat.completions.with_raw_response.create(
        model="gpt-fallback", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert raw.parse().model == "mock-gpt"
    entry = _only_entry(stack)
    after = stack.team_usage(key)
    assert after["usd_committed"] - before["usd_committed"] == expected_cost(entry)
    assert after["requests"] - before["requests"] == 2  # two attempts, two permits


def test_first_stream_byte_arrives_before_upstream_finishes(stack: Stack, key: str) -> None:
    """The first chunk reaches the client while the upstream has not yet reported usage."""
    stack.clear_ledger()
    body = {"model": "gpt-slow", "max_tokens": 40, "stream": True,
            "messages": [{"role": "user", "content": "slow please"}]}
    with httpx.stream("POST", f"{stack.gateway.url}/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {key}"}, timeout=60) as r:
        assert r.status_code == 200
        chunks = r.iter_bytes()
        first = next(chunks)
        assert first.startswith(b"data: ")
        assert stack.ledger() == []  # the upstream has not finished yet
        rest = b"".join(chunks)
    assert rest.rstrip().endswith(b"data: [DONE]")
    assert len(stack.ledger()) == 1
