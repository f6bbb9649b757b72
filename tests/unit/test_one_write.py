"""The server's response cycle: a ``Content-Length`` answer leaves in one ``write``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl

from gateway.server._protocol import OneWriteCycle


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def _cycle(method: str = "POST", *, keep_alive: bool = True) -> tuple[OneWriteCycle, _Transport]:
    transport = _Transport()
    scope: Any = {"type": "http", "method": method, "path": "/", "http_version": "1.1"}
    log = logging.getLogger("test")
    cycle = OneWriteCycle(scope=scope, transport=transport,  # type: ignore[arg-type]
                          flow=FlowControl(transport),  # type: ignore[arg-type]
                          logger=log, access_logger=log, access_log=False,
                          default_headers=[(b"server", b"t")], message_event=asyncio.Event(),
                          expect_100_continue=False, keep_alive=keep_alive,
                          on_response=lambda: None)
    return cycle, transport


_START = {"type": "http.response.start", "status": 200,
          "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]}


async def test_head_and_body_leave_in_one_write() -> None:
    """A Content-Length answer's head waits for its body: one write, bytes unchanged."""
    cycle, transport = _cycle()
    await cycle.send(_START)
    assert transport.writes == []
    await cycle.send({"type": "http.response.body", "body": b"{}", "more_body": False})
    assert transport.writes == [b"HTTP/1.1 200 OK\r\nserver: t\r\ncontent-type: "
                                b"application/json\r\ncontent-length: 2\r\n\r\n{}"]
    assert cycle.response_complete and not transport.closed


async def test_close_after_the_one_write() -> None:
    """Without keep-alive the connection closes after the single write."""
    cycle, transport = _cycle(keep_alive=False)
    await cycle.send(_START)
    await cycle.send({"type": "http.response.body", "body": b"{}", "more_body": False})
    assert len(transport.writes) == 1 and transport.writes[0].endswith(b"\r\n\r\n{}")
    assert b"connection: close" in transport.writes[0] and transport.closed


async def test_stream_head_leaves_at_once() -> None:
    """A chunked answer (a stream) writes its head before its first event arrives."""
    cycle, transport = _cycle()
    await cycle.send({"type": "http.response.start", "status": 200,
                      "headers": [(b"content-type", b"text/event-stream")]})
    assert len(transport.writes) == 1
    assert transport.writes[0].endswith(b"transfer-encoding: chunked\r\n\r\n")
    await cycle.send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
    assert transport.writes[1] == b"9\r\ndata: x\n\n\r\n"


async def test_head_request_still_gets_its_head() -> None:
    """A HEAD answer writes no body: the held head is written on its own."""
    cycle, transport = _cycle("HEAD")
    await cycle.send(_START)
    await cycle.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert len(transport.writes) == 1 and transport.writes[0].endswith(b"content-length: 2\r\n\r\n")
