"""A lean HTTP/1.1 client for the upstream hop: asyncio protocols parsed by httptools.

The gateway sends one kind of request upstream — a POST with a body it already holds
as bytes — and relays the answer as it arrives. httpx, httpcore, anyio and h11 did that
at about 40 % of the gateway's CPU per request (the overhead bench's profile): request
and response models, header normalisation, a pool that scans every (waiting request,
connection) pair on each event, and a task per read. This client does the same work
in a few callbacks:

- one pool per provider, at most ``max_connections`` connections, idle ones reused last
  in first out and dropped after ``keepalive_s`` idle (below the common 5 s server
  keep-alive, so a reused connection is not one the upstream is closing);
- the request head and body leave in one ``write``; the answer's head, body chunks and
  end are parsed as they arrive (``Content-Length``, chunked, or until close), and the
  connection goes back to the pool the moment the answer is complete;
- a stream's unread chunks are bounded (reading pauses above ``_HIGH_WATER`` buffered
  bytes), so a long stream's memory does not grow with its length;
- timeouts as httpx's ``Timeout(timeout_s, connect=connect_timeout_s)``: connect, pool
  wait, each read and a blocked write.

Failures say whether a byte may have reached the upstream (it decides settlement):
:class:`ConnectFailed` / :class:`PoolTimeout` never wrote one; :class:`ReadTimeout`,
:class:`WriteTimeout` and :class:`ConnectionBroken` may have.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httptools

_HIGH_WATER = 256 * 1024
"""Buffered, unread answer bytes above which the connection stops reading."""
_LOW_WATER = 64 * 1024


class ClientError(Exception):
    """The upstream request failed without a complete HTTP answer."""

    dispatched = True


class ConnectFailed(ClientError):
    """No connection (refused, DNS, TLS handshake, connect timeout): nothing was sent."""

    dispatched = False


class PoolTimeout(ClientError):
    """Every connection stayed busy for the whole timeout: nothing was sent."""

    dispatched = False


class ReadTimeout(ClientError):
    """No byte of the answer within the timeout."""


class WriteTimeout(ClientError):
    """The request could not be written within the timeout."""


class ConnectionBroken(ClientError):
    """The connection closed before the answer was complete."""


def _timeout(future: asyncio.Future[Any], exc: type[ClientError], text: str) -> None:
    if not future.done():
        future.set_exception(exc(text))


class _Conn(asyncio.Protocol):
    """One HTTP/1.1 connection; one request at a time."""

    def __init__(self, pool: HttpClient) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.counted = False
        """Counted in the pool's total (from the moment :meth:`HttpClient._open` returns)."""
        self.idle_since = 0.0
        self.response: Response | None = None
        self._header_names: list[bytes] = []
        self._headers: dict[str, str] = {}
        self._writable: asyncio.Future[None] | None = None
        self._until_close = False

    # -- asyncio.Protocol -----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but implement it.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(f"invalid HTTP answer: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        r = self.response
        if r is not None and r.status and self._until_close:
            self.on_message_complete()  # the close ends an answer without a length
            return
        self._broken("connection closed before the answer was complete"
                     + (f" ({exc})" if exc else ""))

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # -- httptools callbacks --------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        h = self._headers
        self._until_close = ("content-length" not in h and "chunked" not in
                             h.get("transfer-encoding", "").lower())
        r = self.response
        if r is not None:
            r.status = self.parser.get_status_code()
            r.headers = self._headers
            r._wake()

    def on_body(self, body: bytes) -> None:
        r = self.response
        if r is not None:
            r._buffer.append(body)
            r._buffered += len(body)
            if r._buffered > _HIGH_WATER and self.transport is not None:
                self.transport.pause_reading()
                r._paused = True
            r._wake()

    def on_message_complete(self) -> None:
        r = self.response
        if r is None:
            return
        r._complete = True
        self.response = None
        keep = (self.parser.should_keep_alive() and not self.closed
                and not self._until_close)
        if r._paused and self.transport is not None:
            r._paused = False
            self.transport.resume_reading()
        r._wake()
        if keep:
            self.pool._release(self)
        else:
            self._close()
            if self.transport is not None and not self.transport.is_closing():
                self.transport.close()

    # -- use ------------------------------------------------------------------------
    def start(self, request: bytes, response: Response) -> None:
        assert self.transport is not None
        self.response = response
        self._headers = {}
        self.transport.write(request)

    def _broken(self, why: str) -> None:
        first = not self.closed
        self.closed = True
        r, self.response = self.response, None
        if r is not None and not r._complete:
            r._error = ConnectionBroken(why)
            r._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(ConnectionBroken(why))
        if first and self.counted:
            self.pool._gone(self)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _close(self) -> None:
        if not self.closed:
            self._broken("closed by the client")

    def abort(self) -> None:
        """Drop the connection (an answer not read to its end cannot be reused)."""
        if self.transport is not None:
            self.transport.abort()
        self._close()


class Response:
    """An upstream answer: status and headers once :meth:`HttpClient.post` returns; the
    body from :meth:`chunks`, as it arrives."""

    def __init__(self, conn: _Conn, read_timeout_s: float) -> None:
        self._conn = conn
        self._timeout_s = read_timeout_s
        self.status = 0
        self.headers: dict[str, str] = {}
        self._buffer: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._complete = False
        self._error: ClientError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        """Until something happens (head, body, end, error), at most the read timeout.

        One timer per answer, not per wait (a stream waits once per event): each wait
        moves the deadline; the timer, when it fires, re-arms for a deadline that moved
        and fails only a wait that is still pending at its own deadline."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        self._deadline = loop.time() + self._timeout_s
        if self._timer is None:
            self._timer = loop.call_at(self._deadline, self._expire)
        try:
            await waiter
        finally:
            self._waiter = None

    def _expire(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nothing pending: the next wait arms a timer again
        loop = asyncio.get_running_loop()
        if loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._expire)
        else:
            _timeout(waiter, ReadTimeout, f"no answer within {self._timeout_s:g}s")

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _head(self) -> None:
        while not self.status and self._error is None:
            await self._wait()
        if not self.status and self._error is not None:
            raise self._error

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises a :class:`ClientError` if it is cut."""
        while True:
            if self._buffer:
                data = b"".join(self._buffer) if len(self._buffer) > 1 else self._buffer[0]
                self._buffer.clear()
                self._buffered = 0
                if self._paused and self._conn.transport is not None:
                    self._paused = False
                    self._conn.transport.resume_reading()
                yield data
                continue
            if self._complete:
                self._stop_timer()
                return
            if self._error is not None:
                self._stop_timer()
                raise self._error
            try:
                await self._wait()
            except ClientError:
                self.close()
                raise

    def close(self) -> None:
        """Release the answer: an unfinished one closes its connection."""
        self._stop_timer()
        if not self._complete:
            self._complete = True
            self._conn.abort()


class HttpClient:
    """A connection pool to one origin (``base_url``), sending POSTs."""

    def __init__(self, base_url: str, *, max_connections: int, timeout_s: float,
                 connect_timeout_s: float, ssl_context: ssl.SSLContext | None = None,
                 headers: dict[str, str] | None = None, keepalive_s: float = 4.0) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.tls = url.scheme == "https"
        self.host = url.hostname
        self.port = url.port or (443 if self.tls else 80)
        self.prefix = url.path.rstrip("/")
        default_port = self.port == (443 if self.tls else 80)
        host_header = self.host if default_port else f"{self.host}:{self.port}"
        if ":" in self.host and not default_port:  # an IPv6 literal
            host_header = f"[{self.host}]:{self.port}"
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in
                              {"host": host_header, **(headers or {})}.items())
        self._ssl = ssl_context if self.tls else None
        self._max = max_connections
        self._timeout_s, self._connect_s = timeout_s, connect_timeout_s
        self._keepalive_s = keepalive_s
        self._idle: list[_Conn] = []
        self._count = 0
        self._waiters: deque[asyncio.Future[_Conn | None]] = deque()
        self._closed = False

    # -- pool -----------------------------------------------------------------------
    def _release(self, conn: _Conn) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def _gone(self, conn: _Conn) -> None:
        self._count -= 1
        if conn in self._idle:
            self._idle.remove(conn)
        self._gone_slot()

    async def _acquire(self) -> _Conn:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            if now - conn.idle_since > self._keepalive_s:
                conn.abort()
                continue
            return conn
        if self._count >= self._max:
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[_Conn | None] = loop.create_future()
            self._waiters.append(waiter)
            timer = loop.call_later(self._timeout_s, _timeout, waiter, PoolTimeout,
                                    f"no free connection within {self._timeout_s:g}s")
            try:
                got = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    handed = waiter.result()
                    if handed is not None:
                        self._release(handed)
                raise
            finally:
                timer.cancel()
            if got is not None and not got.closed:
                return got
            if self._count >= self._max:  # lost the free slot to another opener
                return await self._acquire()
        return await self._open()

    async def _open(self) -> _Conn:
        loop = asyncio.get_running_loop()
        self._count += 1
        try:
            _, conn = await asyncio.wait_for(loop.create_connection(
                lambda: _Conn(self), self.host, self.port, ssl=self._ssl,
                server_hostname=self.host if self._ssl else None), self._connect_s)
        except BaseException as exc:
            self._count -= 1
            self._gone_slot()
            if isinstance(exc, TimeoutError):
                raise ConnectFailed(f"ConnectTimeout: no connection within "
                                    f"{self._connect_s:g}s") from exc
            if isinstance(exc, (OSError, ssl.SSLError)):
                raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc
            raise
        if conn.closed:  # closed between its connect and now
            self._count -= 1
            self._gone_slot()
            raise ConnectFailed("connection closed as soon as it was opened")
        conn.counted = True
        return conn

    def _gone_slot(self) -> None:
        """A connection slot is free: let one waiter open a connection in it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    # -- requests -------------------------------------------------------------------
    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> Response:
        """Send ``body`` to ``path`` (below the base URL's path); the answer once its
        head arrived."""
        if self._closed:
            raise ConnectFailed("client closed")
        conn = await self._acquire()
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head = (f"POST {self.prefix}{path} HTTP/1.1\r\n{self._fixed}{extra}"
                f"content-length: {len(body)}\r\n\r\n").encode("latin-1")
        response = Response(conn, self._timeout_s)
        try:
            conn.start(head + body if len(body) < 65536 else head, response)
            if len(body) >= 65536:
                assert conn.transport is not None
                conn.transport.write(body)
            if conn._writable is not None:
                await self._drained(conn)
            await response._head()
        except BaseException:
            response.close()
            raise
        return response

    async def _drained(self, conn: _Conn) -> None:
        waiter = conn._writable
        if waiter is None:
            return
        timer = asyncio.get_running_loop().call_later(
            self._timeout_s, _timeout, waiter, WriteTimeout,
            f"request not written within {self._timeout_s:g}s")
        try:
            await waiter
        finally:
            timer.cancel()

    async def aclose(self) -> None:
        self._closed = True
        for conn in list(self._idle):
            conn.abort()
        self._idle.clear()
