"""Bedrock's streaming framing: the AWS event-stream (``application/vnd.amazon.eventstream``)
to and from Anthropic's SSE.

``InvokeModelWithResponseStream`` answers with binary event-stream messages
(https://docs.aws.amazon.com/AmazonS3/latest/API/RESTSelectObjectAppendix.html): a
prelude (total length, headers length, CRC32), typed headers, the payload and a CRC32 of
the whole. An ``event`` message of type ``chunk`` carries ``{"bytes": base64}`` whose
bytes are one Anthropic stream event (JSON); an ``exception`` message names its type in
``:exception-type`` (``throttlingException``, ``modelStreamErrorException``, …).

Decoding is botocore's (:class:`botocore.eventstream.EventStreamBuffer`, which checks
both CRCs). botocore has no encoder, so :func:`encode_message` writes the same framing
(string headers only, as Bedrock's are) for the gateway's Bedrock-shaped answers and
the test peer.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:  # botocore loads with the first decoder (a Bedrock answer), not at startup
    from botocore.eventstream import EventStreamMessage

CONTENT_TYPE = "application/vnd.amazon.eventstream"
_STRING = 7
"""The header value type of a UTF-8 string."""


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message (prelude, string headers, payload, both CRC32s)."""
    raw = b"".join(
        struct.pack("!B", len(name)) + name.encode() + struct.pack("!BH", _STRING, len(v))
        + v.encode() for name, v in ((n, val) for n, val in headers.items()))
    total = 12 + len(raw) + len(payload) + 4
    prelude = struct.pack("!II", total, len(raw))
    head = prelude + struct.pack("!I", binascii.crc32(prelude)) + raw + payload
    return head + struct.pack("!I", binascii.crc32(head))


def chunk_message(event: bytes) -> bytes:
    """A ``chunk`` event carrying one Anthropic stream event (JSON bytes)."""
    payload = msgspec.json.encode({"bytes": base64.b64encode(event).decode()})
    return encode_message({":event-type": "chunk", ":content-type": "application/json",
                           ":message-type": "event"}, payload)


def exception_message(kind: str, message: str) -> bytes:
    """An ``exception`` message (``kind`` as Bedrock spells it: ``throttlingException``)."""
    return encode_message({":exception-type": kind, ":content-type": "application/json",
                           ":message-type": "exception"},
                          msgspec.json.encode({"message": message}))


def sse_event(event: bytes) -> bytes:
    """An Anthropic stream event (JSON) as its SSE event (``event: <type>``)."""
    doc = msgspec.json.decode(event)
    name = doc.get("type", "message") if isinstance(doc, dict) else "message"
    return b"event: " + str(name).encode() + b"\ndata: " + event + b"\n\n"


class Decoder:
    """Event-stream bytes in, decoded messages out (botocore's buffer, CRCs checked)."""

    def __init__(self) -> None:
        from botocore.eventstream import EventStreamBuffer
        self._buffer = EventStreamBuffer()

    def feed(self, data: bytes) -> Iterator[EventStreamMessage]:
        self._buffer.add_data(data)
        yield from self._buffer


def message_headers(message: EventStreamMessage) -> dict[str, Any]:
    """A decoded message's headers (botocore's stubs type them as an int)."""
    headers: dict[str, Any] = message.headers  # type: ignore[assignment]
    return headers


def chunk_bytes(message: EventStreamMessage) -> bytes | None:
    """The Anthropic event a ``chunk`` message carries (None for other messages)."""
    headers = message_headers(message)
    if headers.get(":message-type") != "event" or headers.get(":event-type") != "chunk":
        return None
    doc = msgspec.json.decode(message.payload)
    return base64.b64decode(doc["bytes"])
