"""Usage extraction from JSON bodies and SSE streams, for every protocol."""

from __future__ import annotations

import json

import pytest

from gateway.pricing import InvalidUsage, Usage
from gateway.usage import StreamMeter, extract_json, from_anthropic, from_openai


def _sse(data: object, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    body = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {body}\n\n".encode()


def test_openai_cached_tokens_are_split_out_of_prompt_tokens() -> None:
    """OpenAI prompt_tokens includes cached_tokens: input is the uncached remainder."""
    body = json.dumps({"usage": {"prompt_tokens": 100, "completion_tokens": 7,
                                 "prompt_tokens_details": {"cached_tokens": 60}}}).encode()
    assert extract_json("chat", body) == Usage(input=40, output=7, cache_read=60)


def test_embeddings_usage_has_no_output() -> None:
    """Embeddings report prompt_tokens only; output is zero."""
    body = json.dumps({"usage": {"prompt_tokens": 12, "total_tokens": 12}}).encode()
    assert extract_json("embeddings", body) == Usage(input=12)


def test_responses_api_usage_maps_input_cached_and_output() -> None:
    """Responses API: input_tokens minus input_tokens_details.cached_tokens, output_tokens."""
    body = json.dumps({"usage": {"input_tokens": 50, "output_tokens": 9,
                                 "input_tokens_details": {"cached_tokens": 20}}}).encode()
    assert extract_json("responses", body) == Usage(input=30, output=9, cache_read=20)


def test_anthropic_usage_keeps_every_cache_class() -> None:
    """Anthropic cache reads and 5m/1h cache writes map to their own classes."""
    usage = {"input_tokens": 5, "output_tokens": 3, "cache_read_input_tokens": 11,
             "cache_creation_input_tokens": 13,
             "cache_creation": {"ephemeral_5m_input_tokens": 4, "ephemeral_1h_input_tokens": 9}}
    got = extract_json("messages", json.dumps({"usage": usage}).encode())
    assert got == Usage(input=5, output=3, cache_read=11, cache_write_5m=4, cache_write_1h=9)
    assert got is not None and got.price_certain


def test_anthropic_cache_write_without_ttl_split_is_price_uncertain() -> None:
    """Cache writes without the 5m/1h split count as cache_write_unknown (price uncertain)."""
    got = from_anthropic({"input_tokens": 5, "output_tokens": 1,
                          "cache_creation_input_tokens": 8})
    assert got == Usage(input=5, output=1, cache_write_unknown=8)
    assert not got.price_certain


def test_anthropic_null_classes_mean_zero() -> None:
    """Anthropic sends null for unused cache classes; that is zero, not invalid."""
    got = from_anthropic({"input_tokens": 2, "output_tokens": 1,
                          "cache_read_input_tokens": None, "cache_creation_input_tokens": None})
    assert got == Usage(input=2, output=1)


def test_missing_usage_is_none() -> None:
    """A response without a usage object yields None (settled uncertain, not zero)."""
    assert extract_json("chat", b'{"id": "x", "choices": []}') is None
    assert extract_json("messages", b'{"id": "x"}') is None
    assert extract_json("chat", b"not json") is None


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": 5, "completion_tokens": -1},
    {"prompt_tokens": -5, "completion_tokens": 1},
    {"prompt_tokens": 5, "completion_tokens": "7"},
    {"prompt_tokens": 5, "completion_tokens": 1.5},
    {"prompt_tokens": 5, "completion_tokens": True},
    {"prompt_tokens": 1 << 41, "completion_tokens": 1},
    {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 6}},
])
def test_invalid_openai_usage_raises(usage: dict[str, object]) -> None:
    """Negative, non-integer, overflowing or inconsistent usage raises InvalidUsage."""
    with pytest.raises(InvalidUsage):
        from_openai(usage)


def test_negative_anthropic_usage_raises() -> None:
    """A negative Anthropic class raises InvalidUsage."""
    with pytest.raises(InvalidUsage):
        from_anthropic({"input_tokens": 3, "output_tokens": -2})


def _chat_stream(with_usage: bool) -> bytes:
    chunks = [_sse({"choices": [{"index": 0, "delta": {"content": "hi"}}]}),
              _sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})]
    if with_usage:
        chunks.append(_sse({"choices": [], "usage": {"prompt_tokens": 9,
                                                      "completion_tokens": 2}}))
    chunks.append(_sse("[DONE]"))
    return b"".join(chunks)


def test_chat_stream_usage_is_read_from_split_chunks() -> None:
    """Usage is found even when the upstream splits events across arbitrary byte chunks."""
    meter = StreamMeter("chat")
    data = _chat_stream(True)
    out = b"".join(meter.feed(data[i:i + 7]) for i in range(0, len(data), 7)) + meter.flush()
    assert out == data
    assert meter.complete
    assert meter.usage() == Usage(input=9, output=2)


def test_chat_stream_strips_the_usage_only_chunk_when_asked() -> None:
    """With strip_usage_chunk the client sees every chunk except the usage-only one."""
    meter = StreamMeter("chat", strip_usage_chunk=True)
    out = meter.feed(_chat_stream(True)) + meter.flush()
    assert out == _chat_stream(False)
    assert meter.usage() == Usage(input=9, output=2)


def test_stream_without_end_marker_is_not_complete() -> None:
    """A chat stream cut before [DONE] is not complete."""
    meter = StreamMeter("chat")
    meter.feed(_sse({"choices": [{"index": 0, "delta": {"content": "hi"}}]}))
    assert not meter.complete
    assert meter.usage() is None


def test_anthropic_stream_merges_start_and_delta_usage() -> None:
    """message_start usage is updated by the cumulative message_delta usage."""
    start = {"type": "message_start", "message": {"usage": {
        "input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 6,
        "cache_creation": {"ephemeral_5m_input_tokens": 6, "ephemeral_1h_input_tokens": 0}}}}
    events = [_sse(start, "message_start"),
              _sse({"type": "content_block_delta", "delta": {"text": "x"}},
                   "content_block_delta"),
              _sse({"type": "message_delta", "usage": {"output_tokens": 17}}, "message_delta"),
              _sse({"type": "message_stop"}, "message_stop")]
    meter = StreamMeter("messages")
    for e in events:
        assert meter.feed(e) == e
    assert meter.complete
    assert meter.usage() == Usage(input=10, output=17, cache_read=4, cache_write_5m=6)


def test_responses_stream_reads_usage_from_response_completed() -> None:
    """The Responses stream's usage is response.completed's response.usage."""
    meter = StreamMeter("responses")
    meter.feed(_sse({"type": "response.output_text.delta", "delta": "a"},
                    "response.output_text.delta"))
    assert not meter.complete
    meter.feed(_sse({"type": "response.completed", "response": {"usage": {
        "input_tokens": 8, "output_tokens": 2,
        "input_tokens_details": {"cached_tokens": 3}}}}, "response.completed"))
    assert meter.complete
    assert meter.usage() == Usage(input=5, output=2, cache_read=3)


def test_stream_with_negative_usage_raises_on_read() -> None:
    """Invalid usage in a stream surfaces as InvalidUsage when the meter is read."""
    meter = StreamMeter("chat")
    meter.feed(_sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": -5}}))
    with pytest.raises(InvalidUsage):
        meter.usage()


def test_oversized_event_is_passed_on_unparsed() -> None:
    """Bytes without an event boundary beyond MAX_EVENT_BYTES are forwarded, not held."""
    from gateway.usage._stream import MAX_EVENT_BYTES

    meter = StreamMeter("chat")
    blob = b"data: " + b"x" * MAX_EVENT_BYTES
    assert meter.feed(blob[:100]) == b""
    assert meter.feed(blob[100:]) == blob
    assert meter.feed(b"\n\n") == b"\n\n" and meter.usage() is None


def test_event_boundary_split_across_chunks_one_byte_at_a_time() -> None:
    """CRLF delimiters split byte by byte still frame events exactly."""
    meter = StreamMeter("chat")
    data = (b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 0}}\r\n\r\n'
            b"data: [DONE]\r\n\r\n")
    out = b"".join(meter.feed(data[i:i + 1]) for i in range(len(data)))
    assert out == data and meter.complete and meter.usage() == Usage(input=4)


@pytest.mark.parametrize(("endpoint", "body"), [
    ("chat", b'{"usage": {}}'),
    ("chat", b'{"usage": "n/a"}'),
    ("chat", b'{"usage": []}'),
    ("chat", b'{"usage": {"prompt_tokens": 5}}'),
    ("chat", b'{"usage": {"completion_tokens": 5}}'),
    ("responses", b'{"usage": {"input_tokens": 5}}'),
    ("embeddings", b'{"usage": {}}'),
    ("messages", b'{"usage": {"output_tokens": 5}}'),
    ("messages", b'{"usage": {"input_tokens": 5, "output_tokens": null}}'),
])
def test_usage_without_required_counts_is_unknown_not_free(endpoint: str, body: bytes) -> None:
    """A usage object lacking input or output counts is missing usage (bounds kept), never zero."""
    assert extract_json(endpoint, body) is None  # type: ignore[arg-type]


def test_embeddings_need_no_completion_tokens() -> None:
    """Embeddings report only prompt tokens, which is complete usage for them."""
    assert extract_json("embeddings", b'{"usage": {"prompt_tokens": 3, "total_tokens": 3}}') \
        == Usage(input=3)


def test_stream_with_non_object_usage_is_unknown() -> None:
    """A stream whose usage is not an object ends with unknown usage, not a free request."""
    meter = StreamMeter("chat")
    meter.feed(b'data: {"choices": [], "usage": "n/a"}\n\ndata: [DONE]\n\n')
    assert meter.complete and meter.usage() is None


_MIXED = (b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'
          b'event: note\ndata: {"choices": [{"delta":\ndata:  {"content": "b"}}]}\n\n'
          b'data: {"choices": [{"delta": {"content": "c"}}]}\r\n\r\n'
          b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}\n\r\n'
          b"data: [DONE]\n\n")


@pytest.mark.parametrize("size", [1, 2, 3, 7, 40, len(_MIXED)])
def test_lf_and_crlf_events_frame_alike_at_any_split(size: int) -> None:
    """LF-only chunks (found without the regex), CR ones and multi-line data events give
    the same events, content count and usage however the stream is cut into chunks."""
    meter = StreamMeter("chat")
    out = b"".join(meter.feed(_MIXED[i:i + size]) for i in range(0, len(_MIXED), size))
    assert out + meter.flush() == _MIXED
    assert meter.complete and meter.content_events == 3
    assert meter.usage() == Usage(input=4, output=3)
