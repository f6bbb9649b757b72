"""The input bound: body bytes for inline input, the context window for provider-side
input; and the price classes that input can land in, by each protocol's caching rules."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.ceilings import MAX_AMOUNT
from gateway.config import Deployment, ModelSettings
from gateway.errors import BadRequest
from gateway.ingress._bounds import external_input, input_bound, input_classes
from gateway.ingress._prepare import output_bound
from gateway.pricing import (
    ModelPrice,
    Usage,
    cost_bound_micro_usd,
    cost_micro_usd,
    cost_range_micro_usd,
)
from gateway.usage import Endpoint, from_anthropic, from_openai, from_responses

WINDOWED = ModelSettings(name="m", deployments=[Deployment(provider="p")],
                         max_input_tokens=128_000)
UNWINDOWED = ModelSettings(name="m", deployments=[Deployment(provider="p")])


@pytest.mark.parametrize("doc", [
    {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}]},
    {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
    {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "data": "AAAA"}}]}],
     "tools": [{"name": "f", "input_schema": {}}]},
])
def test_inline_requests_are_bounded_by_their_bytes(doc) -> None:  # type: ignore[no-untyped-def]
    """A request carrying all its input inline is bounded by its body length."""
    assert external_input(doc) is None
    assert input_bound(b"x" * 321, doc, UNWINDOWED) == 321 + UNWINDOWED.input_overhead_tokens


@pytest.mark.parametrize(("doc", "where"), [
    ({"model": "m", "input": "go on", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"model": "m", "input": "hi", "conversation": "conv_1"}, "conversation"),
    ({"model": "m", "prompt": {"id": "pmpt_1"}}, "prompt.id"),
    ({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_file", "file_id": "file-1"}]}]}, "input[0].content[0].file_id"),
    ({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]}]},
     "messages[0].content[0].image_url"),
    ({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type=web_search"),
    ({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}]}]},
     "messages[0].content[0].source.type=url"),
])
def test_provider_side_input_needs_the_context_window(doc, where) -> None:  # type: ignore[no-untyped-def]
    """Input the provider adds is bounded by max_input_tokens, and refused without it."""
    assert external_input(doc) == where
    assert input_bound(b"x" * 40, doc, WINDOWED) == 128_000
    with pytest.raises(BadRequest, match="max_input_tokens"):
        input_bound(b"x" * 40, doc, UNWINDOWED)


PLAIN = frozenset({"input", "cache_read"})
WITH_5M = PLAIN | {"cache_write_5m"}
WITH_1H = WITH_5M | {"cache_write_1h"}
USER = {"role": "user", "content": "hi"}


def _block(**cache_control: Any) -> dict[str, Any]:
    return {"type": "text", "text": "stable prefix", "cache_control": cache_control}


@pytest.mark.parametrize(("doc", "expected"), [
    ({"model": "m", "max_tokens": 8, "system": "be brief", "messages": [USER]}, PLAIN),
    ({"model": "m", "system": [_block(type="ephemeral")], "messages": [USER]}, WITH_5M),
    ({"model": "m", "system": [_block(type="ephemeral", ttl="5m")], "messages": [USER]},
     WITH_5M),
    ({"model": "m", "messages": [USER, {"role": "assistant", "content": "ok"},
                                 {"role": "user", "content": [_block(type="ephemeral")]}]},
     WITH_5M),
    ({"model": "m", "messages": [USER], "tools": [
        {"name": "f", "input_schema": {}, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]},
     WITH_1H),
    ({"model": "m", "cache_control": {"type": "ephemeral"}, "messages": [USER]}, WITH_5M),
    ({"model": "m", "cache_control": {"type": "ephemeral", "ttl": "1h"}, "messages": [USER]},
     WITH_1H),
    ({"model": "m", "system": [_block(type="ephemeral", ttl="1h"), _block(type="ephemeral")],
      "messages": [USER]}, WITH_1H),
])
def test_anthropic_cache_writes_need_a_breakpoint_and_1h_needs_its_ttl(
        doc: dict[str, Any], expected: frozenset[str]) -> None:
    """Messages: input and reads always; a 5m write only with a cache_control breakpoint
    (block, tool or top level); a 1h write only with ttl 1h."""
    assert input_classes(doc) == expected


@pytest.mark.parametrize("doc", [
    {"model": "m", "messages": [USER]},
    {"model": "m", "input": "hi", "instructions": "x" * 50, "prompt_cache_key": "k",
     "prompt_cache_retention": "24h"},
    {"model": "m", "input": ["a", "b"]},
])
def test_openai_bodies_get_input_and_cached_input_only(doc: dict[str, Any]) -> None:
    """Chat, Responses and embeddings bodies (no markers): input and cache reads, never a
    write, whatever the cache retention asked for."""
    assert input_classes(doc) == PLAIN


def test_a_marker_on_an_openai_shaped_body_keeps_the_write_class() -> None:
    """cache_control on an OpenAI-shaped body (a proxy fronting Claude bills it) allows
    the write its TTL says."""
    doc = {"model": "m", "messages": [{"role": "system", "content": [_block(type="ephemeral")]},
                                      USER]}
    assert input_classes(doc) == WITH_5M


@pytest.mark.parametrize(("marker", "expected"), [
    (None, PLAIN),
    ({"type": "ephemeral", "ttl": "2h"}, WITH_1H),
    ({"type": "ephemeral", "ttl": None}, WITH_1H),
    ("ephemeral", WITH_1H),
    ([], WITH_1H),
])
def test_a_marker_the_gateway_cannot_read_keeps_the_dearer_class(
        marker: Any, expected: frozenset[str]) -> None:
    """null is no breakpoint; an unknown TTL or a marker that is not an object may be 1h."""
    doc = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x", "cache_control": marker}]}]}
    assert input_classes(doc) == expected


SONNET = ModelPrice(input=3_000_000, output=15_000_000, cache_read=300_000,
                    cache_write_5m=3_750_000, cache_write_1h=6_000_000)


def test_a_plain_claude_request_is_bounded_at_the_input_price() -> None:
    """No marker: the µUSD bound prices input at $3/Mtok, not at the $6 1h write price."""
    doc = {"model": "m", "max_tokens": 100, "messages": [USER]}
    bound = cost_bound_micro_usd(10_000, 100, SONNET, input_classes=input_classes(doc))
    assert bound == 30_000 + 1_500 + 3
    assert cost_bound_micro_usd(10_000, 100, SONNET) == 60_000 + 1_500 + 6


MODEL = ModelSettings(name="m", deployments=[Deployment(provider="p")],
                                max_output_tokens=4096)
_ttls = st.sampled_from([None, "5m", "1h"])


@st.composite
def _anthropic_doc(draw: st.DrawFn) -> tuple[dict[str, Any], frozenset[str]]:
    """A Messages body with breakpoints (or none) on system, tools, messages, top level,
    and the write classes those breakpoints let the provider bill (its rule, written
    here independently of the code under test)."""
    writes: set[str] = set()

    def marker() -> dict[str, Any] | None:
        if not draw(st.booleans()):
            return None
        ttl = draw(_ttls)
        writes.add("cache_write_1h" if ttl == "1h" else "cache_write_5m")
        return {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}

    def text() -> dict[str, Any]:
        block: dict[str, Any] = {"type": "text", "text": draw(st.text(max_size=40))}
        if (cc := marker()) is not None:
            block["cache_control"] = cc
        return block

    doc: dict[str, Any] = {"model": "m", "max_tokens": draw(st.integers(1, 4096)),
                           "system": [text() for _ in range(draw(st.integers(0, 2)))],
                           "messages": [{"role": "user", "content": [text()]}]}
    if draw(st.booleans()):
        tool: dict[str, Any] = {"name": "f", "input_schema": {}}
        if (cc := marker()) is not None:
            tool["cache_control"] = cc
        doc["tools"] = [tool]
    if (cc := marker()) is not None:
        doc["cache_control"] = cc
    return doc, frozenset(writes)


def _split(draw: st.DrawFn, total: int, parts: int) -> list[int]:
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=parts - 1,
                                max_size=parts - 1)))
    return [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]


Case = tuple[Endpoint, dict[str, Any], frozenset[str], Usage]


@st.composite
def anthropic_case(draw: st.DrawFn) -> Case:
    """A Messages request and a wire usage consistent with it, mapped as the gateway does:
    writes only at the TTLs its breakpoints ask for, reported split or unsplit."""
    doc, writes = draw(_anthropic_doc())
    body = msgspec.json.encode(doc)
    used = draw(st.integers(0, input_bound(body, doc, MODEL)))
    if draw(st.booleans()):  # the worst case: every token in one class
        one = draw(st.sampled_from(["input", "cache_read", *sorted(writes)]))
        inp, read, w5, w1 = (used * (one == c) for c in
                             ("input", "cache_read", "cache_write_5m", "cache_write_1h"))
    else:
        inp, read, w5, w1 = _split(draw, used, 4)
    if "cache_write_5m" not in writes:
        inp, w5 = inp + w5, 0
    if "cache_write_1h" not in writes:
        inp, w1 = inp + w1, 0
    usage: dict[str, Any] = {
        "input_tokens": inp, "cache_read_input_tokens": read,
        "cache_creation_input_tokens": w5 + w1,
        "output_tokens": draw(st.integers(0, doc["max_tokens"]))}
    if draw(st.booleans()):  # the TTL split, or only the total (TTL unknown)
        usage["cache_creation"] = {"ephemeral_5m_input_tokens": w5,
                                   "ephemeral_1h_input_tokens": w1}
    mapped = from_anthropic(usage)
    assert mapped is not None
    return "messages", doc, writes, mapped


@st.composite
def openai_case(draw: st.DrawFn) -> Case:
    """A chat, Responses or embeddings request and a wire usage consistent with it (cached
    tokens within the prompt tokens), mapped as the gateway does."""
    endpoint: Endpoint = draw(st.sampled_from(["chat", "responses", "embeddings"]))
    limit = draw(st.integers(1, 4096))
    text = draw(st.text(max_size=200))
    doc: dict[str, Any] = (
        {"model": "m", "input": text} if endpoint == "embeddings"
        else {"model": "m", "max_output_tokens": limit, "input": text}
        if endpoint == "responses"
        else {"model": "m", "max_tokens": limit, "messages": [{"role": "user", "content": text}]})
    body = msgspec.json.encode(doc)
    prompt = draw(st.integers(0, input_bound(body, doc, MODEL)))
    cached = draw(st.integers(0, prompt))
    output = draw(st.integers(0, limit))
    mapped = (
        from_openai({"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached}},
                    embeddings=True) if endpoint == "embeddings"
        else from_responses({"input_tokens": prompt, "output_tokens": output,
                             "input_tokens_details": {"cached_tokens": cached}})
        if endpoint == "responses"
        else from_openai({"prompt_tokens": prompt, "completion_tokens": output,
                          "prompt_tokens_details": {"cached_tokens": cached}}))
    assert mapped is not None
    return endpoint, doc, frozenset(), mapped


_price = st.integers(0, MAX_AMOUNT)
prices = st.one_of(
    st.builds(ModelPrice, input=_price, output=_price, cache_read=_price,
              cache_write_5m=_price, cache_write_1h=_price),
    # every class at one price: rounding up in each class at once
    _price.map(lambda p: ModelPrice(input=p, output=p, cache_read=p, cache_write_5m=p,
                                    cache_write_1h=p)),
    # Anthropic's multipliers (read 0.1x, 5m 1.25x, 1h 2x input), output 5x
    st.integers(0, MAX_AMOUNT // 40).map(lambda q: ModelPrice(
        input=20 * q, output=100 * q, cache_read=2 * q, cache_write_5m=25 * q,
        cache_write_1h=40 * q)))


@given(st.one_of(anthropic_case(), openai_case()), prices)
def test_no_usage_consistent_with_the_request_costs_more_than_its_bound(
        case: Case, price: ModelPrice) -> None:
    """For any prices and any usage the request can produce under its protocol's rules,
    the billed cost (unsplit writes at any TTL the request asked for) and the committed
    figure are within the µUSD bound; with a 1h marker, committed + liability are too."""
    endpoint, doc, writes, usage = case
    body = msgspec.json.encode(doc)
    allowed = input_classes(doc)
    inp = input_bound(body, doc, MODEL)
    out = output_bound(doc, endpoint, MODEL, ceiling=1 << 20)
    assert usage.total_tokens() - usage.output <= inp and usage.output <= out
    bound = cost_bound_micro_usd(inp, out, price, input_classes=allowed)
    low, high = cost_range_micro_usd(usage, price)
    assert low <= bound
    for into in sorted(writes):
        billed = msgspec.structs.replace(usage, cache_write_unknown=0, **{
            into: getattr(usage, into) + usage.cache_write_unknown})
        assert cost_micro_usd(billed, price) <= bound
    if "cache_write_1h" in writes or usage.price_certain:
        assert high <= bound and cost_micro_usd(usage, price) <= bound
