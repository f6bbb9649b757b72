"""The mock model's answers in each protocol's wire shape: JSON bodies and SSE events.

:func:`plan_reply` turns one request into a :class:`MockReply` (status, JSON body or SSE
events, and the ledger entry recording the usage it reports); :func:`play` emits a
reply's events with the configured latency and records the ledger entry at the moment the
final usage is sent, so a test can tell "usage sent" from "first byte sent".
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import msgspec

from gateway.mock import _model as m
from gateway.usage import Endpoint

_ids = itertools.count(1)


@dataclass
class MockReply:
    status: int
    body: bytes | None = None
    events: list[bytes] = field(default_factory=list)
    usage_at: int = -1
    """Index of the event that carries the final usage (the ledger records it then)."""
    entry: dict[str, Any] | None = None
    delay_s: float = 0.0
    """Extra delay between stream events (slow-stream)."""
    body_delay_s: float = 0.0
    """Extra delay before a non-streamed body (slow-stream)."""
    headers: dict[str, str] = field(default_factory=dict)
    """Response headers (a 500 says when to retry, as real upstreams do)."""
    start_delay_s: float = 0.0
    """Delay before the answer starts, headers included (slow-start)."""
    cut_after: int | None = None
    """Break the stream after this many events (cut-stream)."""
    preamble: int = 0
    """Lifecycle events before the first content that the other protocols do not send
    (a cut-stream breaks that many events later)."""


class MockStreamCut(ConnectionError):
    """The mock breaks its stream on purpose (``cut-stream``)."""


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    payload = data if isinstance(data, bytes) else msgspec.json.encode(data)
    return head + b"data: " + payload + b"\n\n"


def _chunks(words: list[str], parts: int) -> list[str]:
    """``words`` in about ``parts`` deltas that join to exactly the non-streamed text
    (``" ".join(words)``), as an SDK's accumulated answer must."""
    if not words:
        return []
    size = -(-len(words) // max(1, parts))
    return [(" " if i else "") + " ".join(words[i:i + size])
            for i in range(0, len(words), size)]


def _error(protocol: str) -> MockReply:
    return error_reply(protocol, 500, 1)


def error_reply(protocol: str, status: int, retry_after: int | None) -> MockReply:
    """An upstream error in the protocol's shape (``retry-after`` when given)."""
    if protocol == "anthropic":
        kind = "rate_limit_error" if status == 429 else "api_error"
        body: dict[str, Any] = {"type": "error", "error": {
            "type": kind, "message": "mock upstream failure"}}
    else:
        body = {"error": {"message": "mock upstream failure", "type": "server_error",
                          "param": None, "code": "mock_error"}}
    headers = {} if retry_after is None else {"retry-after": str(retry_after)}
    return MockReply(status=status, body=msgspec.json.encode(body), headers=headers)


def plan_reply(endpoint: Endpoint, body: dict[str, Any], *,
               bill: Callable[[dict[str, Any]], m.Classes] | None = None) -> MockReply:
    """The mock's complete answer to one request; ``bill`` bills a Messages request
    instead of the stateless arithmetic (the prompt cache, ``gateway.mock._cache``)."""
    model = str(body.get("model", "mock"))
    flags = m.flags_of(model)
    protocol = "anthropic" if endpoint == "messages" else "openai"
    if "error-500" in flags:
        return _error(protocol)
    stream = bool(body.get("stream")) and endpoint != "embeddings"
    n = next(_ids)
    builds: dict[str, Callable[..., tuple[MockReply, Any, Any]]] = {
        "chat": _chat, "responses": _responses, "embeddings": _embeddings,
        "messages": partial(_messages, bill=bill or m.anthropic_classes)}
    build = builds[endpoint]
    reply, usage, classes = build(body, model, flags, n, stream)
    if "missing-usage" in flags:
        usage, classes = None, None
    reply.entry = {"id": n, "model": model, "protocol": protocol, "endpoint": endpoint,
                   "stream": stream, "status": reply.status, "usage": usage,
                   "classes": classes,
                   # the output limit the request carried, as the upstream read it
                   "output_limit": {f: body[f] for f in m.LIMIT_FIELDS if f in body}}
    if "slow-stream" in flags:
        reply.delay_s = m.SLOW_STREAM_DELAY_S
        if not reply.events:
            reply.body_delay_s = m.SLOW_STREAM_CHUNKS * m.SLOW_STREAM_DELAY_S
    if "slow-start" in flags:
        reply.start_delay_s = m.SLOW_START_S
    if "cut-stream" in flags and reply.events:
        reply.cut_after = m.CUT_AFTER_EVENTS + reply.preamble
    return reply


def plan_count(body: dict[str, Any]) -> MockReply:
    """The mock's ``/v1/messages/count_tokens`` answer: ``{"input_tokens": n}`` with the
    count it would bill (``_model.anthropic_count``); ``count-error`` models get a 500,
    ``count-slow`` ones wait ``COUNT_SLOW_S`` first. Not a usage report: no ledger entry."""
    flags = m.flags_of(str(body.get("model", "")))
    if "count-error" in flags:
        return _error("anthropic")
    reply = MockReply(200, msgspec.json.encode({"input_tokens": m.anthropic_count(body)}))
    if "count-slow" in flags:
        reply.start_delay_s = m.COUNT_SLOW_S
    return reply


def _chat(body: dict[str, Any], model: str, flags: frozenset[str], n: int,
          stream: bool) -> tuple[MockReply, Any, Any]:
    c = m.openai_classes(body)
    usage = m.openai_usage(c, negative="negative-usage" in flags)
    words = m.output_words(c.output)
    finish = "length" if c.output >= m.output_limit(body) else "stop"
    base = {"id": f"chatcmpl-mock-{n}", "created": int(time.time()), "model": model}
    if not stream:
        doc = {**base, "object": "chat.completion", "choices": [{
            "index": 0, "finish_reason": finish, "logprobs": None,
            "message": {"role": "assistant", "content": " ".join(words), "refusal": None}}]}
        if "missing-usage" not in flags:
            doc["usage"] = usage
        return MockReply(200, msgspec.json.encode(doc)), usage, c.as_dict()
    opts = body.get("stream_options") or {}
    with_usage = bool(opts.get("include_usage")) and "missing-usage" not in flags
    extra = {"usage": None} if with_usage else {}
    chunk = {**base, "object": "chat.completion.chunk"}
    parts = m.SLOW_STREAM_CHUNKS if "slow-stream" in flags else 4
    events = [_sse({**chunk, **extra, "choices": [{"index": 0, "finish_reason": None,
                    "delta": {"role": "assistant", "content": ""}}]})]
    events += [_sse({**chunk, **extra, "choices": [{"index": 0, "finish_reason": None,
                     "delta": {"content": text}}]}) for text in _chunks(words, parts)]
    events.append(_sse({**chunk, **extra, "choices": [{"index": 0, "delta": {},
                                                       "finish_reason": finish}]}))
    if with_usage:
        events.append(_sse({**chunk, "choices": [], "usage": usage}))
    events.append(_sse(b"[DONE]"))
    return MockReply(200, events=events, usage_at=len(events) - 2), usage, c.as_dict()


def _message_item(n: int, text: str, status: str) -> dict[str, Any]:
    content = [] if status == "in_progress" else [_output_text(text)]
    return {"type": "message", "id": f"msg_mock_{n}", "status": status,
            "role": "assistant", "content": content}


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _response_doc(n: int, model: str, text: str, status: str, usage: Any) -> dict[str, Any]:
    output = [] if status == "in_progress" else [_message_item(n, text, "completed")]
    return {"id": f"resp_mock_{n}", "object": "response", "created_at": int(time.time()),
            "status": status, "model": model, "output": output, "usage": usage,
            "error": None, "incomplete_details": None, "instructions": None,
            "metadata": {}, "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": [], "temperature": 1.0, "top_p": 1.0}


RESPONSES_PREAMBLE = 3
"""Events of a Responses stream between ``response.created`` and its first text delta
(``in_progress``, ``output_item.added``, ``content_part.added``); ``cut-stream`` breaks
that many events later than in the other protocols, so it still cuts after one delta."""


def _responses(body: dict[str, Any], model: str, flags: frozenset[str], n: int,
               stream: bool) -> tuple[MockReply, Any, Any]:
    """A Responses answer; streamed, the event sequence OpenAI sends (and the openai
    SDK's ``responses.stream`` accumulator requires): created, in_progress, the message
    item and its text part opened, the text deltas, then each closed with its full text,
    and ``response.completed`` carrying the usage."""
    c = m.openai_classes(body)
    usage = None if "missing-usage" in flags else m.responses_usage(
        c, negative="negative-usage" in flags)
    words = m.output_words(c.output)
    text = " ".join(words)
    final = _response_doc(n, model, text, "completed", usage)
    if not stream:
        return MockReply(200, msgspec.json.encode(final)), usage, c.as_dict()
    seq = itertools.count()
    item = {"item_id": f"msg_mock_{n}", "output_index": 0, "content_index": 0}

    def event(kind: str, **fields: Any) -> bytes:
        return _sse({"type": kind, "sequence_number": next(seq), **fields}, kind)

    opening = _response_doc(n, model, "", "in_progress", None)
    events = [event("response.created", response=opening),
              event("response.in_progress", response=opening),
              event("response.output_item.added", output_index=0,
                    item=_message_item(n, "", "in_progress")),
              event("response.content_part.added", **item, part=_output_text(""))]
    parts = m.SLOW_STREAM_CHUNKS if "slow-stream" in flags else 4
    events += [event("response.output_text.delta", **item, delta=delta, logprobs=[])
               for delta in _chunks(words, parts)]
    events += [event("response.output_text.done", **item, text=text, logprobs=[]),
               event("response.content_part.done", **item, part=_output_text(text)),
               event("response.output_item.done", output_index=0,
                     item=_message_item(n, text, "completed")),
               event("response.completed", response=final)]
    return (MockReply(200, events=events, usage_at=len(events) - 1,
                      preamble=RESPONSES_PREAMBLE), usage, c.as_dict())


def _vector(text: str, dims: int = 8) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [round((b - 128) / 128, 4) for b in digest[:dims]]


def _embeddings(body: dict[str, Any], model: str, flags: frozenset[str], n: int,
                stream: bool) -> tuple[MockReply, Any, Any]:
    c = m.openai_classes(body, embeddings=True)
    usage = m.openai_usage(c, embeddings=True)
    if "negative-usage" in flags:
        usage = {"prompt_tokens": -5, "total_tokens": -5}
    raw = body.get("input")
    inputs = raw if isinstance(raw, list) else [raw]
    b64 = body.get("encoding_format") == "base64"
    data = []
    for i, item in enumerate(inputs):
        vec = _vector(str(item))
        emb: Any = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode() if b64 else vec
        data.append({"object": "embedding", "index": i, "embedding": emb})
    doc: dict[str, Any] = {"object": "list", "data": data, "model": model}
    if "missing-usage" not in flags:
        doc["usage"] = usage
    return MockReply(200, msgspec.json.encode(doc)), usage, c.as_dict()


def _messages(body: dict[str, Any], model: str, flags: frozenset[str], n: int,
              stream: bool, *, bill: Callable[[dict[str, Any]], m.Classes]
              ) -> tuple[MockReply, Any, Any]:
    c = bill(body)
    usage = m.anthropic_usage(c, negative="negative-usage" in flags)
    missing = "missing-usage" in flags
    words = m.output_words(c.output)
    stop = "max_tokens" if c.output >= m.output_limit(body) else "end_turn"
    msg: dict[str, Any] = {"id": f"msg_mock_{n}", "type": "message", "role": "assistant",
                           "model": model, "stop_reason": stop, "stop_sequence": None,
                           "content": [{"type": "text", "text": " ".join(words)}]}
    if not stream:
        doc = msg if missing else {**msg, "usage": usage}
        return MockReply(200, msgspec.json.encode(doc)), usage, c.as_dict()
    start = {**msg, "content": [], "stop_reason": None}
    if not missing:
        start["usage"] = {**usage, "output_tokens": 1}
    events = [_sse({"type": "message_start", "message": start}, "message_start"),
              _sse({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}, "content_block_start")]
    parts = m.SLOW_STREAM_CHUNKS if "slow-stream" in flags else 4
    events += [_sse({"type": "content_block_delta", "index": 0,
                     "delta": {"type": "text_delta", "text": text}}, "content_block_delta")
               for text in _chunks(words, parts)]
    events.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
    delta: dict[str, Any] = {"type": "message_delta",
                             "delta": {"stop_reason": stop, "stop_sequence": None}}
    if not missing:
        delta["usage"] = {"output_tokens": usage["output_tokens"]}
    events.append(_sse(delta, "message_delta"))
    events.append(_sse({"type": "message_stop"}, "message_stop"))
    return MockReply(200, events=events, usage_at=len(events) - 2), usage, c.as_dict()


async def play(reply: MockReply, *, latency_s: float,
               record: Callable[[dict[str, Any]], None]) -> AsyncIterator[bytes]:
    """Emit a streamed reply: latency before the first event and between events."""
    for i, event in enumerate(reply.events):
        if i == reply.cut_after:
            raise MockStreamCut(f"mock stream cut after {i} events")
        delay = latency_s + (reply.delay_s if i else 0.0)
        if delay:
            await asyncio.sleep(delay)
        if i == reply.usage_at and reply.entry is not None:
            record(reply.entry)
        yield event
    if reply.usage_at < 0 and reply.entry is not None:
        record(reply.entry)
