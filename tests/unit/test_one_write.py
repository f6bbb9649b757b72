"""The server's write cork: what a response cycle writes in one loop turn is one write."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.server._protocol import Cork


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


def _cycle(method: str = "POST", *,
           keep_alive: bool = True) -> tuple[RequestResponseCycle, _Transport]:
    transport = _Transport()
    scope: Any = {"type": "http", "method": method, "path": "/", "http_version": "1.1"}
    log = logging.getLogger("test")
    cork = Cork(transport, asyncio.get_running_loop())
    cycle = RequestResponseCycle(scope=scope, transport=cork,  # type: ignore[arg-type]
                                 flow=FlowControl(transport),  # type: ignore[arg-type]
                                 logger=log, access_logger=log, access_log=False,
                                 default_headers=[(b"server", b"t")],
                                 message_event=asyncio.Event(), expect_100_continue=False,
                                 keep_alive=keep_alive, on_response=lambda: None)
    return cycle, transport


async def _turn() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


_START = {"type": "http.response.start", "status": 200,
          "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]}


async def test_head_and_body_leave_in_one_write() -> None:
    """A JSON answer's head and body, sent in one turn, are one write, bytes unchanged."""
    cycle, transport = _cycle()
    await cycle.send(_START)
    await cycle.send({"type": "http.response.body", "body": b"{}", "more_body": False})
    assert transport.writes == []
    await _turn()
    assert transport.writes == [b"HTTP/1.1 200 OK\r\nserver: t\r\ncontent-type: "
                                b"application/json\r\ncontent-length: 2\r\n\r\n{}"]
    assert cycle.response_complete and not transport.closed


async def test_close_flushes_first() -> None:
    """Without keep-alive the answer is written, then the connection closed."""
    cycle, transport = _cycle(keep_alive=False)
    await cycle.send(_START)
    await cycle.send({"type": "http.response.body", "body": b"{}", "more_body": False})
    assert len(transport.writes) == 1 and transport.writes[0].endswith(b"\r\n\r\n{}")
    assert b"connection: close" in transport.writes[0] and transport.closed


async def test_a_stream_is_written_turn_by_turn() -> None:
    """A stream's head leaves at the end of its turn, before any later event; events of
    later turns are writes of their own; the last event and the end share one."""
    cycle, transport = _cycle()
    await cycle.send({"type": "http.response.start", "status": 200,
                      "headers": [(b"content-type", b"text/event-stream")]})
    await _turn()
    assert len(transport.writes) == 1
    assert transport.writes[0].endswith(b"transfer-encoding: chunked\r\n\r\n")
    await cycle.send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
    await _turn()
    assert transport.writes[1] == b"9\r\ndata: x\n\n\r\n"
    await cycle.send({"type": "http.response.body", "body": b"data: y\n\n", "more_body": True})
    await cycle.send({"type": "http.response.body", "body": b"", "more_body": False})
    await _turn()
    assert transport.writes[2:] == [b"9\r\ndata: y\n\n\r\n0\r\n\r\n"]


async def test_nothing_is_written_to_a_closed_connection() -> None:
    """A peer gone before the turn ended: the corked bytes are dropped."""
    cycle, transport = _cycle()
    await cycle.send(_START)
    transport.closed = True
    await _turn()
    assert transport.writes == []
