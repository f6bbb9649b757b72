"""A client that leaves a stream whose upstream is fast: the gateway stops reading the
upstream at once, however much of it is already buffered, and settles the permit.

The upstream here (:class:`FastUpstream`) is a real socket server that sends a chat
stream of hundreds of MB as fast as the gateway reads it and counts, per connection,
what it sent. A cancellation reaches a task only while it waits; a relay whose upstream
data is always already there never waited, so it used to read the whole stream after
the client left (446 MB) and settle it complete. What the upstream sends after the
disconnect is bounded by what the relay reads after it (one chunk, ≤ 512 KiB) plus what
the kernel's socket buffers take before the gateway's abort arrives (up to tens of MB
on loopback, where the receive buffer grows to ``net.ipv4.tcp_rmem``'s maximum).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e._procs import Proc, create_key, create_team, recv_head, start_gateway

pytestmark = pytest.mark.e2e

MB = 1024 * 1024
STREAM_BYTES = 512 * MB
"""What the upstream would send in all: far more than it sends once the client left."""
AFTER_BOUND = 64 * MB
"""What the upstream may send after the client left: the relay's last chunk plus the
socket buffers on both sides of the upstream connection (see the module docstring)."""
PRICE = {"input": 1_000_000, "output": 4_000_000}
MAX_OUTPUT = 1_000_000

_CONTENT = "x" * 1000
_EVENT = ("data: " + json.dumps({
    "id": "chatcmpl-fast", "object": "chat.completion.chunk", "created": 0,
    "model": "fast", "choices": [{"index": 0, "delta": {"content": _CONTENT},
                                  "finish_reason": None}]}) + "\n\n").encode()
_BLOCK = _EVENT * 64
_TAIL = ("data: " + json.dumps({
    "id": "chatcmpl-fast", "object": "chat.completion.chunk", "created": 0,
    "model": "fast", "choices": [],
    "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}})
    + "\n\ndata: [DONE]\n\n").encode()
_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
         b"connection: close\r\n\r\n")


@dataclass
class Sent:
    """One upstream connection: body bytes sent so far, and when sending stopped."""

    bytes: int = 0
    ended_at: float | None = None
    broken: bool = False
    """The gateway closed the connection before the stream's end."""


class FastUpstream:
    """An OpenAI-style upstream on a real socket: each request gets a chat stream of
    ``total`` bytes of content events (then a usage chunk and ``[DONE]``), sent as fast
    as the gateway reads it; what it sent is counted per connection."""

    def __init__(self, *, total: int = STREAM_BYTES) -> None:
        self.total = total
        self.streams: list[Sent] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            sent = Sent()
            self.streams.append(sent)
            threading.Thread(target=self._serve, args=(conn, sent), daemon=True).start()

    def _serve(self, conn: socket.socket, sent: Sent) -> None:
        with conn:
            data = recv_head(conn)
            if b"\r\n\r\n" not in data:
                return
            head, _, body = data.partition(b"\r\n\r\n")
            match = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
            length = int(match.group(1)) if match else 0
            while len(body) < length:
                body += conn.recv(65536)
            try:
                conn.sendall(_HEAD)
                while sent.bytes < self.total:
                    conn.sendall(_BLOCK)
                    sent.bytes += len(_BLOCK)
                conn.sendall(_TAIL)
                sent.bytes += len(_TAIL)
            except OSError:
                sent.broken = True
            finally:
                sent.ended_at = time.monotonic()

    def wait_ended(self, index: int, *, deadline_s: float) -> Sent:
        """Connection ``index`` once it stopped sending (a hang guard, not a timing)."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if len(self.streams) > index and self.streams[index].ended_at is not None:
                return self.streams[index]
            time.sleep(0.01)
        raise AssertionError(f"upstream connection {index} still sending after "
                             f"{deadline_s}s: {self.streams[index:index + 1]}")


def fast_gateway(workdir: Path, upstream: FastUpstream, **server: Any) -> tuple[Proc, str]:
    """A local-profile ``mayu serve`` with model ``fast`` on ``upstream``, and a key."""
    config = workdir / "mayu.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(workdir / "data"), "demo": False,
        "server": {"max_output_tokens": MAX_OUTPUT, **server},
        "providers": [{"name": "fast", "kind": "openai", "base_url": upstream.url,
                       "timeout_s": 30}],
        "models": [{"name": "fast", "price": PRICE,
                    "deployments": [{"provider": "fast"}]}]}))
    create_team(config, "fast", "--usd-micros-per-day", str(10**12))
    key = create_key(config, "fast")
    return start_gateway(config), key


def open_stream(port: int, key: str, *, max_tokens: int = 100_000) -> socket.socket:
    """A raw connection that has sent one streamed chat request (nothing read yet)."""
    body = json.dumps({"model": "fast", "max_tokens": max_tokens, "stream": True,
                       "messages": [{"role": "user", "content": "all of it"}]}).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def read_head(sock: socket.socket, *, at_least: int = 0) -> str:
    """Read the answer's head (and at least ``at_least`` bytes in all); its permit."""
    data = b""
    while b"\r\n\r\n" not in data or len(data) < at_least:
        more = sock.recv(1024 * 1024)
        assert more, f"connection closed: {data[:500]!r}"
        data += more
    head = data.partition(b"\r\n\r\n")[0].decode("latin-1")
    assert head.startswith("HTTP/1.1 200"), head
    match = re.search(r"x-inferplane-permit: *(\S+)", head, re.IGNORECASE)
    assert match, head
    return match.group(1)


def settled_lines(data: Path) -> list[dict[str, Any]]:
    return [rec for path in sorted(data.glob("audit-*.jsonl"))
            for rec in map(json.loads, path.read_text().splitlines())
            if rec.get("event") == "settled"]


def wait_settled(data: Path, permits: list[str], *, deadline_s: float
                 ) -> dict[str, dict[str, Any]]:
    """The settled audit line of each permit (a hang guard, not a timing)."""
    end = time.monotonic() + deadline_s
    while True:
        lines = {rec["permit"]: rec for rec in settled_lines(data)}
        if all(p in lines for p in permits) or time.monotonic() > end:
            missing = [p for p in permits if p not in lines]
            assert not missing, f"not settled within {deadline_s}s: {missing}"
            return lines
        time.sleep(0.05)


@pytest.fixture(scope="module")
def aborting(tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[Proc, str, FastUpstream, Path]]:
    """(gateway, key, its fast upstream, data dir): drain_on_disconnect_s 0."""
    workdir = tmp_path_factory.mktemp("abort")
    up = FastUpstream()
    try:
        gateway, key = fast_gateway(workdir, up)
        try:
            yield gateway, key, up, workdir / "data"
        finally:
            gateway.stop()
    finally:
        up.close()


def _leave_after_reading(gateway: Proc, key: str, upstream: FastUpstream,
                         count: int) -> list[tuple[str, int, int]]:
    """Open ``count`` streams one after the other (so each is the upstream's next
    connection), read 1 MB of each, close them all; (permit, upstream connection index,
    bytes it had sent when the client closed) per stream."""
    base = len(upstream.streams)
    socks, permits = [], []
    for _ in range(count):
        socks.append(open_stream(gateway.port, key))
        permits.append(read_head(socks[-1], at_least=MB))
    left = []
    for i, (sock, permit) in enumerate(zip(socks, permits, strict=True)):
        sock.close()
        left.append((permit, base + i, upstream.streams[base + i].bytes))
    return left


@pytest.mark.parametrize("count", [1, 5])
def test_a_client_leaving_a_fast_stream_stops_the_upstream_read(
        aborting: tuple[Proc, str, FastUpstream, Path], count: int) -> None:
    """drain_on_disconnect_s 0: once the client left, the upstream sends at most
    AFTER_BOUND more (not the rest of its 512 MB), and the permit settles uncertain at
    once: the relayed output committed, the rest of the bound liability."""
    gateway, key, upstream, data = aborting
    left = _leave_after_reading(gateway, key, upstream, count)
    for _, index, at_close in left:
        sent = upstream.wait_ended(index, deadline_s=30)
        assert sent.broken, sent
        assert sent.bytes - at_close <= AFTER_BOUND, (
            f"the upstream sent {(sent.bytes - at_close) / MB:.0f} MB after the client left")
    lines = wait_settled(data, [p for p, _, _ in left], deadline_s=10)
    for permit, _, _ in left:
        line = lines[permit]
        assert line["outcome"] == "uncertain", line
        assert line["detail"] == "client disconnected mid-stream", line
        assert 0 < line["tokens_committed"] < line["token_bound"], line
        assert line["tokens_committed"] + line["tokens_liability"] == line["token_bound"]
        assert line["usd_committed"] + line["usd_liability"] == line["usd_bound"]

