"""The upstream HTTP client (gateway.providers._client) against real loopback servers.

Pins what settlement relies on: a failure before any byte left is ``dispatched=False``
(connect refused, pool exhausted), one after is ``dispatched=True`` (no answer in time,
an answer cut); connections are reused only after a complete answer; a stream's unread
bytes stay bounded whatever its length.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from gateway.providers._client import (
    _HIGH_WATER,
    ConnectFailed,
    ConnectionBroken,
    HttpClient,
    PoolTimeout,
    ReadTimeout,
)
from tests.e2e._procs import free_port

pytestmark = pytest.mark.e2e

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head + await reader.readexactly(length)


class Server:
    def __init__(self, handler: Handler) -> None:
        self.handler, self.connections = handler, 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _server(handler: Handler) -> AsyncIterator[tuple[Server, str]]:
    s = Server(handler)
    port = free_port()
    s.server = await asyncio.start_server(s._serve, "127.0.0.1", port)
    try:
        yield s, f"http://127.0.0.1:{port}/v1"
    finally:
        s.server.close()


def _client(url: str, **kw: float) -> HttpClient:
    return HttpClient(url, max_connections=int(kw.pop("max_connections", 4)),
                      timeout_s=kw.pop("timeout_s", 5.0), connect_timeout_s=1.0)


async def _body(client: HttpClient) -> tuple[int, bytes]:
    r = await client.post("/chat/completions", b'{"a":1}', {})
    return r.status, b"".join([c async for c in r.chunks()])


async def test_keep_alive_reuses_one_connection_after_complete_answers() -> None:
    """Sequential requests share one kept-alive connection, each answer read whole."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await _read_request(reader)
            assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
            writer.write(OK)
    async for server, url in _server(handler):
        client = _client(url)
        for _ in range(3):
            assert await _body(client) == (200, b"{}")
        assert server.connections == 1
        await client.aclose()


async def test_chunked_and_close_delimited_answers_arrive_whole() -> None:
    """A chunked answer and one delimited by the connection's close are read to their end."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for part in (b"data: 1\n\n", b"data: 2\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the close")
        await writer.drain()
    async for _, url in _server(handler):
        client = _client(url)
        assert await _body(client) == (200, b"data: 1\n\ndata: 2\n\n")
        assert await _body(client) == (200, b"until the close")
        await client.aclose()


async def test_connect_refused_is_not_dispatched() -> None:
    """Nothing listening: ConnectFailed, which says no byte left (a full refund)."""
    client = _client(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ConnectFailed) as caught:
        await _body(client)
    assert caught.value.dispatched is False


async def test_pool_exhausted_is_not_dispatched() -> None:
    """Every connection busy for the whole timeout: PoolTimeout, nothing was sent."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf")
        await asyncio.sleep(5)
    async for server, url in _server(handler):
        client = _client(url, max_connections=1, timeout_s=0.3)
        held = await client.post("/x", b"{}", {})  # its answer is never finished
        with pytest.raises(PoolTimeout) as caught:
            await client.post("/x", b"{}", {})
        assert caught.value.dispatched is False
        assert server.connections == 1
        held.close()
        await client.aclose()


async def test_no_answer_in_time_is_dispatched() -> None:
    """The request was written and nothing came back in time: ReadTimeout, dispatched."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)
    async for _, url in _server(handler):
        client = _client(url, timeout_s=0.3)
        with pytest.raises(ReadTimeout) as caught:
            await _body(client)
        assert caught.value.dispatched is True
        await client.aclose()


async def test_read_timeout_is_per_read_not_per_answer() -> None:
    """A stream whose chunks come more often than the timeout is read whole however long
    it lasts; a stall of one timeout after its last chunk is a ReadTimeout in about that
    time (one timer per answer, its deadline moved by each read)."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(6):
            await asyncio.sleep(0.1)
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
        await asyncio.sleep(5)
    async for _, url in _server(handler):
        client = _client(url, timeout_s=0.3)
        r = await client.post("/x", b"{}", {})
        got = b""
        loop = asyncio.get_running_loop()
        with pytest.raises(ReadTimeout):
            async for chunk in r.chunks():
                got += chunk
                last = loop.time()
        assert got == b"x" * 6
        assert 0.25 < loop.time() - last < 1.0
        assert r._timer is None  # nothing left armed once the answer is given up
        await client.aclose()


async def test_cut_answer_raises_and_its_connection_is_not_reused() -> None:
    """An answer cut mid-body raises ConnectionBroken; the next request opens a new
    connection."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        if server.connections == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
            await writer.drain()
            return  # closes mid-body
        writer.write(OK)
    async for server, url in _server(handler):
        client = _client(url)
        r = await client.post("/x", b"{}", {})
        with pytest.raises(ConnectionBroken) as caught:
            async for _ in r.chunks():
                pass
        assert caught.value.dispatched is True
        assert await _body(client) == (200, b"{}")
        assert server.connections == 2
        await client.aclose()


async def test_long_stream_buffers_a_bounded_amount() -> None:
    """20 MB streamed to a slow reader: the unread bytes stay within one read of the
    high-water mark (reading pauses), so a stream's memory does not grow with its
    length."""
    part = b"x" * 65536
    total = 20 * 1024 * 1024

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        for _ in range(total // len(part)):
            writer.write(part)
            await writer.drain()
    async for _, url in _server(handler):
        client = _client(url)
        r = await client.post("/x", b"{}", {})
        seen, peak = 0, 0
        async for chunk in r.chunks():
            seen += len(chunk)
            peak = max(peak, len(chunk))
            await asyncio.sleep(0.002)  # a slow client
        assert seen == total
        # At most one read (the loop's 256 KiB) lands after reading paused.
        assert peak <= _HIGH_WATER + 256 * 1024, peak
        await client.aclose()
