"""The input bound: body bytes for inline input, the context window for provider-side input."""

from __future__ import annotations

import pytest

from gateway.config import Deployment, ModelSettings
from gateway.errors import BadRequest
from gateway.ingress._bounds import external_input, input_bound

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
