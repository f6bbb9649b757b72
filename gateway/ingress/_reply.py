"""An answer of the request path, and how it goes out: as raw ASGI, or to Litestar.

The generation routes build a :class:`Reply` (status, headers, a body or a stream) and
send it with :func:`send_reply`, below Litestar's response objects. Its bytes are what
Litestar's ``Response``/``Stream`` sent for the same answer (header order and case,
``content-type`` with ``; charset=utf-8`` for ``text/*``, ``content-length``, a stream's
end): ``tests/e2e/test_fast_path.py`` pins them on the wire.

A stream is sent as Litestar's streaming response sent it, which the relay's settlement
relies on (``gateway.ingress._dispatch``): while it is relayed, a watcher awaits the
client's ``http.disconnect`` and cancels the relaying through an anyio cancel scope (so
the relay's shielded settlements finish first); a cancelled relay parked at a ``yield``
stays open; then ``after`` runs however the stream ended (shielded, also when the server
cancelled the request at its drain deadline, so the relay still settles).

Why relaying stopped early goes to the relay in its :class:`Hangup`: the client left, or
the server cut the stream at shutdown. The relay reads it between upstream chunks, since
the cancel scope's cancellation reaches a task only while it waits on something not yet
done, and a relay whose upstream data is already buffered never does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from litestar import Response
from litestar.exceptions import ImproperlyConfiguredException

_NO_BODY = frozenset({204, 304})

CLIENT_LEFT = "client disconnected"
CUT_AT_SHUTDOWN = "cut at shutdown"


class Hangup:
    """Why a streamed reply stopped before its end, once it has: :data:`CLIENT_LEFT`
    (the watcher saw ``http.disconnect``) or :data:`CUT_AT_SHUTDOWN` (a cancellation
    that is not the client's: the server's drain deadline). Set by the sender, read by
    the relay between upstream chunks and when it settles."""

    __slots__ = ("why",)

    def __init__(self) -> None:
        self.why: str | None = None


@dataclass(slots=True)
class Reply:
    """One answer: ``body`` bytes, or ``stream`` chunks then ``after`` (however it ended)."""

    status: int
    headers: dict[str, str]
    media_type: str = "application/json"
    body: bytes = b""
    stream: AsyncGenerator[bytes, None] | None = None
    after: Callable[[], Awaitable[None]] | None = None
    hangup: Hangup | None = None
    """A stream's: why it stopped early, told to its relay."""


def _content_type(media_type: str) -> str:
    media_type = media_type or "application/json"
    return f"{media_type}; charset=utf-8" if media_type.startswith("text/") else media_type


def _raw(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def _head(reply: Reply) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The ASGI headers and body, as Litestar's ``ASGIResponse`` builds them."""
    raw = _raw(reply.headers)
    body = reply.body
    if reply.status in _NO_BODY or reply.status < 200:
        if body and body != b"null":
            raise ImproperlyConfiguredException(
                "response content is not supported for HEAD responses and responses with a "
                "status code that does not allow content (304, 204, < 200)")
        return raw, b""
    names = {k for k, _ in raw}
    if b"content-type" not in names:
        raw.append((b"content-type", _content_type(reply.media_type).encode("latin-1")))
    if b"content-length" not in names:
        raw.append((b"content-length", str(len(body)).encode("latin-1")))
    return raw, body


def prepare(reply: Reply) -> Callable[[Any, Any, Any], Awaitable[None]]:
    """The ASGI callable that sends ``reply`` (raises, before anything is sent, where
    Litestar would have refused to build the response)."""
    if reply.stream is not None:
        return _stream_sender(reply)
    headers, body = _head(reply)
    status = reply.status

    async def send_json(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
    return send_json


def _stream_sender(reply: Reply) -> Callable[[Any, Any, Any], Awaitable[None]]:
    """The ASGI callable that relays ``reply.stream`` (chunked; see the module docstring)."""
    assert reply.stream is not None
    relay, after, status = reply.stream, reply.after, reply.status
    hangup = reply.hangup or Hangup()
    headers = _raw(reply.headers)
    names = {k for k, _ in headers}
    if b"content-type" not in names:
        headers.append((b"content-type", _content_type(reply.media_type).encode("latin-1")))

    async def send_stream(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        try:
            with anyio.CancelScope() as relaying:
                watcher = asyncio.get_running_loop().create_task(
                    _watch(receive, relaying, hangup))
                try:
                    async for chunk in relay:
                        await send({"type": "http.response.body", "body": chunk,
                                    "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                finally:
                    watcher.cancel()
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                # Not the client's (``relaying`` swallows that one): the server cancelled
                # the request at its drain deadline, maybe with the relay parked at a yield.
                hangup.why = hangup.why or CUT_AT_SHUTDOWN
            if after is not None:
                with anyio.CancelScope(shield=True):
                    await after()
            raise
        if after is not None:
            await after()
    return send_stream


async def _watch(receive: Any, relaying: anyio.CancelScope, hangup: Hangup) -> None:
    """Cancel ``relaying`` when the client disconnects (after the end, the server
    reports a disconnect too: by then nothing is left to cancel)."""
    while not relaying.cancel_called:
        message = await receive()
        if message["type"] == "http.disconnect":
            hangup.why = hangup.why or CLIENT_LEFT
            relaying.cancel()
            return


def to_litestar(reply: Reply) -> Response[bytes]:
    """``reply`` (a body, not a stream) as a Litestar response (its error handler's)."""
    return Response(reply.body, status_code=reply.status, headers=reply.headers,
                    media_type=reply.media_type)
