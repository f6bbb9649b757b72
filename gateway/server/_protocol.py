"""uvicorn's httptools protocol with the limits it lacks: header size and read timeouts.

uvicorn's httptools protocol buffers a request head for as long as the client keeps
sending it and waits for it forever: 20 connections each sending 10 MB of unfinished
headers, with no key, grew the gateway from 74 to 302 MB (issue 10). This subclass adds:

- ``max_header_bytes``: a request line plus headers above it is answered ``431`` and the
  connection closed. Counted on the raw bytes while the head is incomplete (so a huge
  unfinished header never buffers more than one read beyond the limit) and on the
  parsed line and headers once it is complete.
- ``header_timeout_s``: the head must be complete within this long (from the connection,
  or from its first byte on a kept-alive connection): else ``408`` and close, or a plain
  close if nothing arrived at all.
- ``body_timeout_s``: the body must be complete within this long after the head: else
  the connection is closed, which the app sees as a client disconnect.

And fewer writes: uvicorn writes a response head as soon as the app sends it, then each
body message in a ``write`` of its own; each is a TCP segment and, on loopback, the
receiver's side of the kernel work too (the second write of a JSON answer cost more CPU
than Litestar's whole request handling). The response cycles write through a
:class:`Cork`: what they write in one loop turn leaves in one ``write`` at its end — a
JSON answer's head and body, a stream's events that arrived together and its end.

Idle kept-alive connections are closed by uvicorn's own ``timeout_keep_alive``, and the
number of connections is bounded by its ``limit_concurrency`` (both set by
:func:`gateway.server.serve`). It relies on uvicorn's protocol internals (``parser``,
``cycle``, ``transport``); ``tests/e2e/test_http_limits.py`` pins the behaviour, so a
uvicorn upgrade that changes them fails there.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class Cork:
    """A connection's transport as its response cycles see it: what they write in one
    event-loop turn leaves in one ``write`` at the end of the turn (or before a close).

    Writes keep their order (every cycle of the connection writes through it, and the
    protocol flushes it before writing or closing on its own); nothing waits longer
    than the turn it was written in, so no answer, head or event is delayed.
    """

    __slots__ = ("loop", "parts", "transport")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self.parts:
            self.loop.call_soon(self.flush)
        self.parts.append(data)

    def flush(self) -> None:
        parts = self.parts
        if parts:
            self.parts = []
            # Closing here means the peer went away (the protocol flushes before any
            # close of its own): what it would have been sent is dropped, as uvicorn
            # drops an answer to a disconnected client.
            if not self.transport.is_closing():
                self.transport.write(parts[0] if len(parts) == 1 else b"".join(parts))

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a head size limit and head/body read deadlines."""

    max_header_bytes: ClassVar[int] = 64 * 1024
    header_timeout_s: ClassVar[float] = 10.0
    body_timeout_s: ClassVar[float] = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_raw: int | None = 0
        """Raw bytes received since the current head began; None once it is complete."""
        self._head_parsed = 0
        self._too_large = False
        self._rejected = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    # -- connection ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._cork = Cork(transport, self.loop)
        self._arm_head_timer()

    def shutdown(self) -> None:
        self._cork.flush()  # uvicorn may close the transport itself here
        super().shutdown()

    def timeout_keep_alive_handler(self) -> None:
        self._cork.flush()
        super().timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel(head=True, body=True)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        if self._head_raw is not None:
            self._head_raw += len(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # As uvicorn's own data_received (this gateway has no WebSocket route).
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if self._too_large:
                self._reject(431, "Request header fields too large.")
            else:
                self.logger.warning("Invalid HTTP request received.")
                self._reject(400, "Invalid HTTP request received.")
            return
        if self._head_raw is not None and self._head_raw > self.max_header_bytes:
            self._reject(431, "Request header fields too large.")

    # -- parser callbacks ----------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_parsed = 0
        if self._head_raw is None:  # a kept-alive connection's next request
            self._head_raw = 0
        if self._head_timer is None:
            self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_raw = None
        self._cancel(head=True)
        super().on_headers_complete()
        if self.cycle is not None:
            # The cycle uvicorn just built writes through the connection's cork.
            self.cycle.transport = self._cork  # type: ignore[assignment]
        assert self.transport is not None
        if not self.transport.is_closing():
            self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_timeout)

    def on_message_complete(self) -> None:
        self._cancel(body=True)
        super().on_message_complete()

    # -- limits --------------------------------------------------------------------
    def _count(self, n: int) -> None:
        self._head_parsed += n
        if self._head_parsed > self.max_header_bytes:
            self._too_large = True
            # Aborts feed_data: httptools re-raises as HttpParserCallbackError.
            raise ValueError("request head too large")

    def _arm_head_timer(self) -> None:
        self._cancel(head=True)
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._head_raw is None or self._rejected:
            return
        if self._head_raw == 0:  # nothing of a request arrived: just an idle socket
            self._close()
        else:
            self._reject(408, "Request header timeout.")

    def _body_timeout(self) -> None:
        self._body_timer = None
        self._close()  # the app's receive() reports http.disconnect

    def _cancel(self, *, head: bool = False, body: bool = False) -> None:
        if head and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if body and self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _close(self) -> None:
        self._cork.flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _reject(self, status: int, message: str) -> None:
        """Answer ``status`` and close; just close if a response is being written."""
        self._rejected = True
        self._cancel(head=True, body=True)
        self._cork.flush()
        if self.transport is None or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()  # never interleave with a response in flight
            return
        body = message.encode("ascii")
        head = [httptools_impl.STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: text/plain; charset=utf-8\r\n",
                 b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                 b"connection: close\r\n\r\n", body]
        self.transport.write(b"".join(head))
        self.transport.close()


def guarded_protocol(*, max_header_bytes: int, header_timeout_s: float,
                     body_timeout_s: float) -> type[GuardedHttpToolsProtocol]:
    """A protocol class with these limits (uvicorn instantiates it per connection)."""
    return type("GatewayHttpProtocol", (GuardedHttpToolsProtocol,),
                {"max_header_bytes": max_header_bytes, "header_timeout_s": header_timeout_s,
                 "body_timeout_s": body_timeout_s})
