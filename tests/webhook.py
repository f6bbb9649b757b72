"""A small real HTTP server that records webhook deliveries (budget alert tests).

It runs in a thread of the test process on 127.0.0.1, answers each POST with the next
status of ``statuses`` (then 200), and keeps every request's headers and body so a test
can count deliveries and verify their signatures with the shared secret.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.body)
        return doc

    def signed_with(self, secret: str) -> bool:
        """The ``x-inferplane-signature`` header is the HMAC-SHA256 of the body."""
        expected = "sha256=" + hmac.new(secret.encode(), self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(self.headers.get("x-inferplane-signature", ""), expected)


class WebhookReceiver:
    def __init__(self, statuses: list[int] | None = None) -> None:
        self.received: list[Received] = []
        self.attempts = 0
        self._statuses = list(statuses or [])
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver._lock:
                    receiver.attempts += 1
                    status = receiver._statuses.pop(0) if receiver._statuses else 200
                    if status == 200:
                        receiver.received.append(Received(
                            headers={k.lower(): v for k, v in self.headers.items()},
                            body=body))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, count: int, *, timeout_s: float = 30.0) -> list[Received]:
        """Wait until at least ``count`` deliveries arrived; returns all received."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.received) >= count:
                    return list(self.received)
            time.sleep(0.05)
        with self._lock:
            return list(self.received)

    async def until(self, count: int, *, timeout_s: float = 30.0) -> list[Received]:
        """:meth:`wait_for` for a test whose event loop runs the gateway (never blocks)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.received) < count:
            await asyncio.sleep(0.05)
        with self._lock:
            return list(self.received)
