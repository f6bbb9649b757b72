"""An answer of the request path, and how it goes out: as raw ASGI, or to Litestar.

The generation routes build a :class:`Reply` (status, headers, a body or a stream) and
send it with :func:`send_reply`, below Litestar's response objects. Its bytes are what
Litestar's ``Response``/``Stream`` sent for the same answer (header order and case,
``content-type`` with ``; charset=utf-8`` for ``text/*``, ``content-length``, a stream's
end): ``tests/e2e/test_fast_path.py`` compares the two on the wire. A stream is sent by
Litestar's own streaming response (its client-disconnect watch and background task are
the semantics the relay's settlement relies on: ``gateway.ingress._dispatch``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from litestar import Response
from litestar.background_tasks import BackgroundTask
from litestar.exceptions import ImproperlyConfiguredException
from litestar.response.streaming import ASGIStreamingResponse

_NO_BODY = frozenset({204, 304})


@dataclass(slots=True)
class Reply:
    """One answer: ``body`` bytes, or ``stream`` chunks then ``after`` (however it ended)."""

    status: int
    headers: dict[str, str]
    media_type: str = "application/json"
    body: bytes = b""
    stream: AsyncGenerator[bytes, None] | None = None
    after: Callable[[], Awaitable[None]] | None = None


def _content_type(media_type: str) -> str:
    media_type = media_type or "application/json"
    return f"{media_type}; charset=utf-8" if media_type.startswith("text/") else media_type


def _head(reply: Reply) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The ASGI headers and body, as Litestar's ``ASGIResponse`` builds them."""
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()]
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
        after = reply.after
        return ASGIStreamingResponse(
            iterator=reply.stream, status_code=reply.status, headers=reply.headers,
            media_type=reply.media_type, content_length=0,
            background=BackgroundTask(after) if after is not None else None)
    headers, body = _head(reply)
    status = reply.status

    async def send_json(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
    return send_json


def to_litestar(reply: Reply) -> Response[bytes]:
    """``reply`` (a body, not a stream) as a Litestar response (its error handler's)."""
    return Response(reply.body, status_code=reply.status, headers=reply.headers,
                    media_type=reply.media_type)
