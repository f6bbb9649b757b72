"""The base of the tests' own small HTTP servers (``http.server``): a handler that keeps
the test output clean and answers a whole body in one call."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """No access log on stderr; :meth:`send` answers ``status`` with one body."""

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
