"""Usage from JSON bodies and, incrementally, from SSE streams as chunks pass.

:class:`StreamMeter` sits in the relay: it is fed raw upstream bytes, hands back the
complete SSE events to forward (a partial event waits for its end, never the whole
stream), and watches the usage-bearing events of each protocol:

- chat completions: the final chunk with a ``usage`` object, then ``data: [DONE]``;
- responses: ``response.completed`` (or ``.incomplete`` / ``.failed``) → ``response.usage``;
- Anthropic messages: ``message_start.message.usage`` updated by ``message_delta.usage``
  (cumulative), finished by ``message_stop``.

It can also drop the usage-only chat chunk (empty ``choices``) that the gateway asked for
on the client's behalf, so the client never sees a chunk it did not request.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import msgspec

from gateway.pricing import InvalidUsage, Usage
from gateway.usage._map import from_anthropic, from_openai, from_responses

Endpoint = Literal["chat", "responses", "embeddings", "messages"]

_EVENT_END = re.compile(rb"\r?\n\r?\n")
MAX_EVENT_BYTES = 8 * 1024 * 1024
"""An "event" this long without a blank line is not SSE we can meter: it is passed on
unparsed rather than held (memory stays bounded whatever the upstream sends)."""
_RESPONSE_DONE = ("response.completed", "response.incomplete", "response.failed")
# An event carrying generated content: one such event proves at least one output token
# (a lower bound the settlement of a cut stream may commit). Empty strings prove nothing.
_CHAT_CONTENT = re.compile(rb'"(?:content|arguments|refusal)"\s*:\s*"(?!")')
_RESPONSES_CONTENT = re.compile(rb'"type"\s*:\s*"response\.[a-z_.]*delta"')
_ANTHROPIC_CONTENT = re.compile(rb'"(?:text|thinking|partial_json)"\s*:\s*"(?!")')


def _decode(data: bytes) -> Any:
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None


def extract_json(endpoint: Endpoint, body: bytes) -> Usage | None:
    """Usage of a non-streamed response body; ``None`` if it reports none."""
    doc = _decode(body)
    if not isinstance(doc, dict):
        return None
    usage = doc.get("usage")
    if endpoint == "messages":
        return from_anthropic(usage)
    if endpoint == "responses":
        return from_responses(usage)
    return from_openai(usage, embeddings=endpoint == "embeddings")


def _data_of(event: bytes) -> tuple[bytes | None, bytes]:
    """(event name, joined data) of one SSE event."""
    line = event.rstrip(b"\r\n")
    if line.startswith(b"data:") and b"\n" not in line and b"\r" not in line:
        return None, line[5:].removeprefix(b" ")  # one data line: most events
    name: bytes | None = None
    data: list[bytes] = []
    for line in event.splitlines():
        if line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
        elif line.startswith(b"event:"):
            name = line[6:].strip()
    return name, b"\n".join(data)


class StreamMeter:
    """Incremental SSE usage watcher and event re-framer for one upstream stream."""

    def __init__(self, endpoint: Endpoint, *, strip_usage_chunk: bool = False) -> None:
        self.endpoint = endpoint
        self.strip_usage_chunk = strip_usage_chunk
        self.complete = False
        """The protocol's end-of-stream marker was seen."""
        self._buffer = b""
        self._scan_from = 0
        self._raw_usage: dict[str, Any] | None = None
        self.content_events = 0
        """Events relayed that carried generated content (>= 1 output token each)."""

    def feed(self, chunk: bytes) -> bytes:
        """Consume upstream bytes; return the complete events to forward now."""
        buf = self._buffer + chunk if self._buffer else chunk
        out: list[bytes] = []
        start = 0
        # Resume the search just before the old end: a delimiter may straddle chunks.
        pos = max(0, self._scan_from - 3)
        # Without a CR, the only event end is LF LF: find it without the regex.
        plain = b"\r" not in buf
        while True:
            if plain:
                at = buf.find(b"\n\n", pos)
                end = -1 if at < 0 else at + 2
            else:
                match = _EVENT_END.search(buf, pos)
                end = -1 if match is None else match.end()
            if end < 0:
                break
            event = buf[start:end]
            start = pos = end
            if self._observe(event):
                out.append(event)
        self._buffer = buf[start:] if start else buf
        self._scan_from = len(self._buffer)
        if len(self._buffer) > MAX_EVENT_BYTES:
            out.append(self._buffer)
            self._buffer, self._scan_from = b"", 0
        return b"".join(out)

    def flush(self) -> bytes:
        """Whatever trails the last complete event (forwarded as is at stream end)."""
        rest, self._buffer = self._buffer, b""
        if rest.strip() and not self._observe(rest):
            return b""
        return rest

    def usage(self) -> Usage | None:
        """The usage reported so far (``None`` if none); raises InvalidUsage."""
        if self._raw_usage is None:
            return None
        if self.endpoint == "messages":
            return from_anthropic(self._raw_usage)
        if self.endpoint == "responses":
            return from_responses(self._raw_usage)
        return from_openai(self._raw_usage, embeddings=self.endpoint == "embeddings")

    def _observe(self, event: bytes) -> bool:
        """Record usage from one event; False when the event must not be forwarded."""
        name, data = _data_of(event)
        if self.endpoint == "messages":
            self._anthropic(name, data)
        elif self.endpoint == "responses":
            self._responses(name, data)
        else:
            return self._chat(data)
        return True

    def _chat(self, data: bytes) -> bool:
        if data.strip() == b"[DONE]":
            self.complete = True
            return True
        if _CHAT_CONTENT.search(data):
            self.content_events += 1
        if b'"usage"' not in data:
            return True
        doc = _decode(data)
        if not isinstance(doc, dict) or doc.get("usage") is None:
            return True
        self._raw_usage = doc["usage"] if isinstance(doc["usage"], dict) else {}
        usage_only = doc.get("choices") == []
        return not (usage_only and self.strip_usage_chunk)

    def _responses(self, name: bytes | None, data: bytes) -> None:
        if b"delta" in data and _RESPONSES_CONTENT.search(data) and b'"delta":""' not in data:
            self.content_events += 1
            return
        if not any(marker.encode() in data for marker in _RESPONSE_DONE):
            return
        doc = _decode(data)
        if not isinstance(doc, dict) or doc.get("type") not in _RESPONSE_DONE:
            return
        self.complete = True
        response = doc.get("response")
        if isinstance(response, dict) and response.get("usage") is not None:
            usage = response["usage"]
            self._raw_usage = usage if isinstance(usage, dict) else {}

    def _anthropic(self, name: bytes | None, data: bytes) -> None:
        if b"content_block_delta" in data:
            if _ANTHROPIC_CONTENT.search(data):
                self.content_events += 1
            return
        if not (b"message_start" in data or b"message_delta" in data
                or b"message_stop" in data):
            return
        doc = _decode(data)
        if not isinstance(doc, dict):
            return
        kind = doc.get("type")
        if kind == "message_stop":
            self.complete = True
        elif kind == "message_start":
            message = doc.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                self._raw_usage = dict(usage)
        elif kind == "message_delta" and isinstance(doc.get("usage"), dict):
            # message_delta usage is cumulative; fields it carries replace the start's.
            merged = dict(self._raw_usage or {})
            merged.update({k: v for k, v in doc["usage"].items() if v is not None})
            self._raw_usage = merged


def stream_error_event(endpoint: Endpoint, message: str) -> bytes:
    """The protocol's own in-stream error event, which makes its SDKs raise: a stream
    the gateway could not finish must never look like a clean end."""
    if endpoint == "messages":
        body = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + msgspec.json.encode(body) + b"\n\n"
    error = {"message": message, "type": "server_error", "param": None,
             "code": "upstream_stream_cut"}
    if endpoint == "responses":
        doc = {"type": "error", "code": "upstream_stream_cut", "message": message,
               "param": None, "error": error}
        return b"event: error\ndata: " + msgspec.json.encode(doc) + b"\n\n"
    return b"data: " + msgspec.json.encode({"error": error}) + b"\n\n"


__all__ = ["Endpoint", "InvalidUsage", "StreamMeter", "extract_json", "stream_error_event"]
