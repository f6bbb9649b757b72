"""The input bound refined with the provider's count (gateway.ingress._refine, issue 26).

The counting provider is the built-in mock (``MockProvider``), which counts exactly as it
bills (``gateway.mock.anthropic_count``), so the property checks the refined bound —
counted, cached or prefix-extended — against what the upstream would bill.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import Deployment, ModelSettings, ProviderSettings, load_settings
from gateway.errors import ConfigError
from gateway.governance import BYTE, COUNTED, FAILED, PREFIX, Bounds
from gateway.ingress._attempt import Call
from gateway.ingress._bounds import input_bound, input_classes
from gateway.ingress._refine import Refiner, allowance, prefix_chain
from gateway.mock import anthropic_classes
from gateway.pricing import ModelPrice, Usage, cost_bound_micro_usd, cost_micro_usd
from gateway.providers import MockProvider, count_body

MODEL = ModelSettings(name="claude", deployments=[Deployment(provider="mock")],
                      max_output_tokens=4096)
DEPLOYMENT = MODEL.deployments[0]
PROVIDER = MockProvider(ProviderSettings(name="mock", kind="mock"))
OPUS = ModelPrice(input=5_000_000, output=25_000_000, cache_read=500_000,
                  cache_write_5m=6_250_000, cache_write_1h=10_000_000)


def _call(doc: dict[str, Any], model: ModelSettings = MODEL) -> Call:
    body = msgspec.json.encode(doc)
    bounds = Bounds(input_tokens=input_bound(body, doc, model),
                    output_tokens=doc.get("max_tokens", 1), price=model.price,
                    input_classes=input_classes(doc))
    return Call(gw=None, principal=None, endpoint="messages",  # type: ignore[arg-type]
                model=model, doc=doc, body=body, stream=False, bounds=bounds,
                client_headers={}, deployments=[])


def _refined(call: Call, refined: Any, deployment: Deployment) -> Call:
    """The call with the refiner's result taken (as ``gateway.ingress._refine.refine``)."""
    return call.refined(call.bounds.with_input(refined.tokens, refined.basis, refined.note),
                        deployment)


def _billed_input(doc: dict[str, Any]) -> int:
    c = anthropic_classes(doc)
    return c.input + c.cache_read + c.cache_write_5m + c.cache_write_1h + c.cache_write_unknown


_text = st.text(max_size=300)


@st.composite
def _message(draw: st.DrawFn, i: int) -> dict[str, Any]:
    """A user or assistant turn as Claude Code sends them: text, tool calls, results."""
    if i % 2:
        content: list[dict[str, Any]] = [{"type": "text", "text": draw(_text)}]
        if draw(st.booleans()):
            content.append({"type": "tool_use", "id": f"toolu_{i}", "name": "Read",
                            "input": {"path": draw(_text)}})
        return {"role": "assistant", "content": content}
    block = draw(st.sampled_from(["text", "result"]))
    if block == "result":
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}",
                                             "content": draw(_text)}]}
    return {"role": "user", "content": [{"type": "text", "text": draw(_text)}]}


def _mark(doc: dict[str, Any], ttl: str | None) -> dict[str, Any]:
    """Claude Code's moving breakpoint: on the last message's last block."""
    doc = json.loads(json.dumps(doc))
    last = doc["messages"][-1]
    if isinstance(last["content"], str):
        last["content"] = [{"type": "text", "text": last["content"]}]
    last["content"][-1]["cache_control"] = {"type": "ephemeral",
                                            **({"ttl": ttl} if ttl else {})}
    return doc


@st.composite
def session(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two turns of one session: the second re-sends the first's messages and appends."""
    system = [{"type": "text", "text": draw(_text),
               **({"cache_control": {"type": "ephemeral"}} if draw(st.booleans()) else {})}]
    tools = [{"name": f"T{i}", "description": draw(_text),
              "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}}}
             for i in range(draw(st.integers(0, 3)))]
    n = draw(st.integers(0, 3)) * 2 + 1
    m = n + draw(st.integers(1, 3)) * 2
    messages = [draw(_message(i)) for i in range(m)]
    ttl = draw(st.sampled_from([None, "5m", "1h"]))
    base = {"model": "mock-claude", "max_tokens": draw(st.integers(1, 4096)),
            "system": system, **({"tools": tools} if tools else {})}
    return (_mark({**base, "messages": messages[:n]}, ttl),
            _mark({**base, "messages": messages}, ttl))


def _prices() -> st.SearchStrategy[ModelPrice]:
    return st.integers(0, 10_000_000).map(lambda q: ModelPrice(
        input=20 * q, output=100 * q, cache_read=2 * q, cache_write_5m=25 * q,
        cache_write_1h=40 * q))


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(session(), _prices())
def test_the_refined_bound_covers_what_the_upstream_bills(
        turns: tuple[dict[str, Any], dict[str, Any]], price: ModelPrice) -> None:
    """For Claude-Code-shaped sessions: the counted bound of a request, and the bound of
    the next turn from the cached count of its prefix plus the appended bytes, are never
    below the input the (mock) upstream bills for it, nor their µUSD bounds below its cost."""
    first, second = turns
    refiner = Refiner(timeout_s=5, entries=16)

    async def both() -> list[tuple[Call, int]]:
        out = []
        for doc, basis in ((first, COUNTED), (second, PREFIX)):
            call = _call(doc)
            refined = await refiner.tighter(call, DEPLOYMENT, PROVIDER)
            assert refined is not None and refined.basis == basis
            out.append((_refined(call, refined, DEPLOYMENT), refined.tokens))
        return out

    for (call, tokens), doc in zip(asyncio.run(both()), turns, strict=True):
        assert tokens >= _billed_input(doc)
        bounds = call.bounds
        assert bounds.input_tokens == min(tokens, bounds.byte_input)
        classes = anthropic_classes(doc)
        actual = cost_micro_usd(Usage(**classes.as_dict()), price)
        assert actual <= cost_bound_micro_usd(bounds.input_tokens, bounds.output_tokens,
                                              price, input_classes=bounds.input_classes)


def test_an_agent_turn_is_bounded_several_fold_tighter_and_counted_once() -> None:
    """A 60 KB Claude-Code-like prefix: the counted bound is a fraction of the byte bound;
    the same request again is answered from the cache (no second count); moving the
    cache_control breakpoint changes nothing."""
    doc = {"model": "mock-claude", "max_tokens": 64000,
           "system": [{"type": "text", "text": "word " * 8000,
                       "cache_control": {"type": "ephemeral"}}],
           "tools": [{"name": f"T{i}", "description": "describe " * 300,
                      "input_schema": {"type": "object"}} for i in range(8)],
           "messages": [{"role": "user", "content": [{"type": "text", "text": "fix it"}]}]}
    refiner = Refiner(timeout_s=5, entries=16)
    call = _call(doc)
    first = asyncio.run(refiner.tighter(call, DEPLOYMENT, PROVIDER))
    assert first is not None and first.basis == COUNTED
    assert first.tokens * 3 < call.bounds.byte_input
    moved = _mark(doc, None)
    del moved["system"][0]["cache_control"]
    again = asyncio.run(refiner.tighter(_call(moved), DEPLOYMENT, PROVIDER))
    assert again is not None and again.basis == COUNTED and "cached" in again.note
    assert again.tokens == first.tokens


@pytest.mark.parametrize(("upstream", "timeout_s"), [("mock-count-error", 5.0),
                                                     ("mock-count-slow", 0.05)])
def test_a_count_that_fails_or_times_out_leaves_the_byte_bound(
        upstream: str, timeout_s: float) -> None:
    """A count answered with an error, or not within the timeout, leaves the sound byte
    bound in force and says so (basis byte-count-failed); nothing is cached."""
    doc = {"model": upstream, "max_tokens": 100,
           "messages": [{"role": "user", "content": "hello " * 500}]}
    refiner = Refiner(timeout_s=timeout_s, entries=16)
    call, there = _call(doc), Deployment(provider="mock", upstream_model=upstream)
    refined = asyncio.run(refiner.tighter(call, there, PROVIDER))
    assert refined is not None and refined.basis == FAILED
    assert refined.tokens == call.bounds.byte_input
    call = _refined(call, refined, there)
    assert call.bounds.input_tokens == call.bounds.byte_input
    assert call.bounds.input_basis == FAILED
    assert asyncio.run(refiner.tighter(call, there, PROVIDER)) is None  # asked once
    assert refiner.cache.longest(prefix_chain(doc, scope="x")) is None


def test_requests_that_make_the_provider_add_input_are_never_counted() -> None:
    """A server tool (web search) or an image by URL makes the provider add input the
    count cannot see: such a request keeps its context-window bound; so does an OpenAI
    endpoint, and a model with refine_input off."""
    refiner = Refiner(timeout_s=5, entries=16)
    windowed = ModelSettings(name="claude", deployments=[DEPLOYMENT], max_input_tokens=200_000)
    search = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "q"}],
              "tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    assert not refiner.eligible(_call(search, windowed), DEPLOYMENT, PROVIDER)
    plain = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "q"}]}
    assert refiner.eligible(_call(plain), DEPLOYMENT, PROVIDER)
    off = Deployment(provider="mock", refine_input="off")
    assert not refiner.eligible(_call(plain), off, PROVIDER)
    chat = msgspec.structs.replace(_call(plain), endpoint="chat")
    assert not refiner.eligible(chat, DEPLOYMENT, PROVIDER)


def test_the_count_cache_keeps_at_most_its_entries() -> None:
    """The cache is bounded: past ``refine_cache_entries`` the least recently used count
    is dropped."""
    refiner = Refiner(timeout_s=5, entries=2)
    docs = [{"model": "mock-claude", "max_tokens": 5,
             "messages": [{"role": "user", "content": f"request {i} " * 50}]}
            for i in range(3)]
    for doc in docs:
        asyncio.run(refiner.tighter(_call(doc), DEPLOYMENT, PROVIDER))
    scope = "mock\0\0claude\0"
    hits = [refiner.cache.longest(prefix_chain(d, scope=scope)) for d in docs]
    assert hits[0] is None and hits[1] is not None and hits[2] is not None


def test_the_count_request_carries_only_what_count_tokens_accepts() -> None:
    """max_tokens, stream, metadata and sampling fields are left out (Anthropic's
    count_tokens refuses them); the model is the deployment's upstream model."""
    doc = {"model": "alias", "max_tokens": 9, "stream": True, "temperature": 0.2,
           "metadata": {"user_id": "u"}, "system": "s", "tools": [], "thinking": {
               "type": "enabled", "budget_tokens": 1024}, "tool_choice": {"type": "auto"},
           "messages": [{"role": "user", "content": "hi"}]}
    sent = msgspec.json.decode(count_body(doc, model="claude-opus-4-8"))
    assert sent == {"model": "claude-opus-4-8", "system": "s", "tools": [],
                    "tool_choice": {"type": "auto"}, "thinking": doc["thinking"],
                    "messages": doc["messages"]}


def test_the_allowance_is_a_share_of_the_count_with_a_floor() -> None:
    """count_allowance_pct of the count, never below 64 tokens."""
    assert allowance(100, 5) == 64 and allowance(30_000, 5) == 1500
    assert allowance(30_001, 5) == 1501


def test_a_bad_refine_setting_is_refused_naming_its_key(tmp_path: Path) -> None:
    """models[].refine_input outside on_shortfall|always|off, or a negative allowance,
    stops startup with the key's path."""
    for key, value, path in (("refine_input", "sometimes", "models[0].refine_input"),
                             ("count_allowance_pct", -1, "models[0].count_allowance_pct")):
        config = tmp_path / "mayu.yaml"
        config.write_text(json.dumps({"providers": [{"name": "p", "kind": "mock"}],
                                      "models": [{"name": "m", key: value,
                                                  "deployments": [{"provider": "p"}]}]}))
        with pytest.raises(ConfigError, match=path.replace("[", r"\[").replace("]", r"\]")):
            load_settings(config)


def test_a_fallback_deployment_starts_again_from_the_byte_bound() -> None:
    """A bound refined by one deployment's count is not used for an attempt on another
    deployment (its provider did not count): that attempt starts from the byte bound."""
    doc = {"model": "mock-claude", "max_tokens": 10,
           "messages": [{"role": "user", "content": "hello " * 500}]}
    call = _call(doc)
    refined = asyncio.run(Refiner(timeout_s=5, entries=4).tighter(call, DEPLOYMENT,
                                                                  PROVIDER))
    assert refined is not None
    call = _refined(call, refined, DEPLOYMENT)
    assert call.bounds.input_tokens < call.bounds.byte_input
    call = call.for_deployment(DEPLOYMENT)  # the same deployment: kept
    assert call.bounds.input_basis == COUNTED
    call = call.for_deployment(Deployment(provider="other"))
    bounds = call.bounds
    assert bounds.input_basis == BYTE and bounds.input_tokens == bounds.byte_input
    assert call.usd_bound == cost_bound_micro_usd(bounds.byte_input, 10, MODEL.price,
                                                  input_classes=bounds.input_classes)


def test_appended_images_and_documents_are_counted_not_bounded_by_their_bytes() -> None:
    """A next turn that appends a PDF or an image is counted by the provider (a compressed
    PDF page can bill more tokens than its bytes), not bounded by prefix + bytes."""
    opening: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "a " * 400}]}]
    first = {"model": "mock-claude", "max_tokens": 10, "messages": opening}
    refiner = Refiner(timeout_s=5, entries=8)
    asyncio.run(refiner.tighter(_call(first), DEPLOYMENT, PROVIDER))
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                          "data": "JVBERi0xLjQK"}}
    for block in (pdf, {**pdf, "type": "image"}):
        second = {**first, "messages": [*opening,
                                        {"role": "assistant", "content": "ok"},
                                        {"role": "user", "content": [block]}]}
        refined = asyncio.run(refiner.tighter(_call(second), DEPLOYMENT, PROVIDER))
        assert refined is not None and refined.basis == COUNTED
    plain = {**first, "messages": [*opening, {"role": "assistant", "content": "ok"},
                                   {"role": "user", "content": "more"}]}
    refined = asyncio.run(refiner.tighter(_call(plain), DEPLOYMENT, PROVIDER))
    assert refined is not None and refined.basis == PREFIX


def test_a_count_made_under_another_beta_header_is_not_reused() -> None:
    """The client's anthropic-beta header is forwarded to the count and is part of the
    cache key: a request with another beta is counted again, not served the old count."""
    doc = {"model": "mock-claude", "max_tokens": 10,
           "messages": [{"role": "user", "content": "hello " * 300}]}
    refiner = Refiner(timeout_s=5, entries=8)
    asyncio.run(refiner.tighter(_call(doc), DEPLOYMENT, PROVIDER))
    beta = msgspec.structs.replace(
        _call(doc), client_headers={"anthropic-beta": "token-efficient-tools-2025-02-19"})
    refined = asyncio.run(refiner.tighter(beta, DEPLOYMENT, PROVIDER))
    assert refined is not None and "cached" not in refined.note
    again = asyncio.run(refiner.tighter(_call(doc), DEPLOYMENT, PROVIDER))
    assert again is not None and "cached" in again.note
