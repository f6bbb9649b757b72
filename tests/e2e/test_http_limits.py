"""HTTP hardening of ``mayu serve``, as a real process and raw sockets.

A request head above ``server.max_header_bytes`` is answered 431 (complete or not, so an
unfinished 10 MB header is cut off after the limit); a head that does not arrive within
``server.header_timeout_s`` gets 408; a body that stalls past ``server.body_timeout_s``
loses its connection; a normal request on the same server is unaffected. The gateway
runs uvicorn's httptools parser (``gateway/server/_protocol.py`` adds these limits).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml

from tests.e2e._procs import Proc, create_key, create_team, start_gateway

pytestmark = pytest.mark.e2e

MAX_HEADER = 8 * 1024


KEY: list[str] = []


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    workdir = tmp_path_factory.mktemp("limits")
    config = workdir / "mayu.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(workdir / "data"), "demo": False,
        "server": {"max_header_bytes": MAX_HEADER, "header_timeout_s": 1.0,
                   "body_timeout_s": 1.0, "keep_alive_s": 2}}))
    create_team(config, "t")
    KEY.append(create_key(config, "t"))
    proc = start_gateway(config)
    try:
        yield proc
    finally:
        proc.stop()


def _connect(proc: Proc) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proc.port), timeout=10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def test_a_complete_but_oversized_head_is_431(gateway: Proc) -> None:
    """A header block above max_header_bytes: 431 and the connection is closed."""
    r = httpx.get(f"{gateway.url}/healthz", headers={"x-big": "a" * (2 * MAX_HEADER)})
    assert r.status_code == 431
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200


def test_an_unfinished_huge_header_is_cut_off_at_the_limit(gateway: Proc) -> None:
    """A header that never ends: 431 after about the limit, not after 10 MB."""
    with _connect(gateway) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-flood: ")
        sent = 0
        try:
            while sent < 10 * 1024 * 1024:
                sock.sendall(b"a" * 65536)
                sent += 65536
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = _read_all(sock)
    assert sent < 10 * 1024 * 1024, "the server read the whole 10 MB"
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]


def test_a_slow_head_gets_408_and_an_idle_socket_is_closed(gateway: Proc) -> None:
    """Half a request line held back past header_timeout_s: 408; a connection that
    sends nothing at all is closed too (no socket is held forever)."""
    with _connect(gateway) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")  # no blank line: unfinished
        answer = _read_all(sock)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:100]
    assert 0.8 < waited < 5, waited
    with _connect(gateway) as sock:
        started = time.monotonic()
        assert _read_all(sock) == b""
        assert time.monotonic() - started < 5


def test_a_stalled_body_loses_its_connection(gateway: Proc) -> None:
    """A valid key, headers promising 1000 bytes, 10 arrive: the gateway waits for the
    body only body_timeout_s, then closes the connection."""
    with _connect(gateway) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"authorization: Bearer " + KEY[0].encode() + b"\r\n"
                     b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n"
                     b"{\"model\":")
        answer = _read_all(sock)
        waited = time.monotonic() - started
    assert 0.8 < waited < 4, (waited, answer[:200])
    assert not answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_normal_requests_keep_working_on_a_kept_alive_connection(gateway: Proc) -> None:
    """Several requests over one connection, each well under the limits, all answer."""
    with httpx.Client(base_url=gateway.url) as client:
        for _ in range(5):
            assert client.get("/healthz", headers={"x-ok": "a" * 1000}).status_code == 200
