"""The per-replica audit file: one JSON line per request, append-only.

Each replica writes its own file (never shared between processes), opened with
``O_APPEND`` so every line lands whole at the end even if an operator tails or rotates
it. A line records who called, what was admitted, what happened upstream, how the permit
was settled and what it cost — for streams this is where the exact cost is found.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

log = logging.getLogger("mayu.audit")


def default_audit_path(data_dir: str, replica_id: str | None) -> str:
    replica = replica_id or f"{socket.gethostname()}-{os.getpid()}"
    return str(Path(data_dir) / f"audit-{replica}.jsonl")


class AuditLog:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def open(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def write(self, record: dict[str, Any]) -> None:
        """Append one record; an audit failure is logged, never fails the request."""
        if self._fd is None:
            return
        line = msgspec.json.encode({"ts": datetime.now(UTC).isoformat(), **record}) + b"\n"
        try:
            os.write(self._fd, line)
        except OSError as exc:
            log.error("audit write to %s failed: %s", self.path, exc)
