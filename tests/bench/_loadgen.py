"""A lean closed-loop HTTP/1.1 load generator for the speed bench (not a test).

``concurrency`` kept-alive connections, each sending one fixed, pre-encoded request and
the next as soon as the previous answer is complete (``Content-Length`` or chunked,
parsed by httptools), until ``n`` answers arrived. A request costs it a few tens of µs
of CPU, so the figures measure the server, not the client. Every non-200 answer is
counted, and the first one's body kept, so a bench can refuse to report a broken run.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httptools


@dataclass
class LoadResult:
    latencies: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    errors: int = 0
    first_error: str = ""

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.wall_s if self.wall_s else 0.0

    def pct(self, p: float) -> float:
        """The p-th percentile latency in ms."""
        ordered = sorted(self.latencies)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] * 1e3


def request_bytes(host: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"host: {host}", "content-type: application/json",
            f"content-length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class _Conn(asyncio.Protocol):
    def __init__(self, gen: _Gen) -> None:
        self.gen = gen
        self.parser = httptools.HttpResponseParser(self)
        self.t0 = 0.0
        self.body: list[bytes] = []
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]
        self.send()

    def send(self) -> None:
        if not self.gen.take():
            self.t.close()
            return
        self.t0 = time.perf_counter()
        self.body = []
        self.t.write(self.gen.request)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        if self.parser.get_status_code() != 200:
            self.body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        self.gen.done(time.perf_counter() - self.t0, status, b"".join(self.body))
        self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


class _Gen:
    def __init__(self, request: bytes, n: int, record: bool) -> None:
        self.request, self.left, self.record = request, n, record
        self.result = LoadResult()

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True

    def done(self, latency: float, status: int, body: bytes) -> None:
        if status != 200:
            self.result.errors += 1
            if not self.result.first_error:
                self.result.first_error = f"HTTP {status}: {body[:300]!r}"
        elif self.record:
            self.result.latencies.append(latency)


async def _run(port: int, request: bytes, n: int, concurrency: int,
               record: bool) -> LoadResult:
    gen = _Gen(request, n, record)
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    conns = [(await loop.create_connection(lambda: _Conn(gen), "127.0.0.1", port))[1]
             for _ in range(concurrency)]
    await asyncio.gather(*(c.lost for c in conns))
    gen.result.wall_s = time.perf_counter() - started
    return gen.result


def run_load(port: int, path: str, body: bytes, *, headers: dict[str, str], n: int,
             concurrency: int, warmup: int = 200) -> LoadResult:
    """Warm up (``warmup`` requests, not recorded), then ``n`` recorded requests."""
    request = request_bytes(f"127.0.0.1:{port}", path, body, headers)
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    if warmup:
        runner(_run(port, request, warmup, concurrency, False))
    return runner(_run(port, request, n, concurrency, True))
