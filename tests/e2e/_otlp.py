"""The test side of ``tests/e2e/otlp_receiver.py``: start it, read what it stored.

    with otlp_receiver(tmp_path) as otlp:            # a real receiver process
        config["telemetry"] = {"endpoint": otlp.url}
        ...
        spans = otlp.wait_spans(lambda s: any(x["name"] == "settlement" for x in s))
        otlp.metrics(); otlp.logs(); otlp.raw_text()  # everything that arrived

``hang=True`` starts one that accepts connections and never answers. :func:`closed_port`
is a port nothing listens on (a collector that is down).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.e2e._procs import ROOT, _env, free_port, terminate

Rows = list[dict[str, Any]]


class OtlpReceiver:
    def __init__(self, popen: subprocess.Popen[bytes], port: int, out: Path) -> None:
        self.popen, self.port, self.out = popen, port, out

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _rows(self, name: str) -> Rows:
        path = self.out / name
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def spans(self) -> Rows:
        return self._rows("spans.jsonl")

    def metrics(self) -> Rows:
        return self._rows("metrics.jsonl")

    def logs(self) -> Rows:
        return self._rows("logs.jsonl")

    def raw_text(self) -> str:
        """Every file the receiver wrote, as one text (to search for what must not be)."""
        return "".join(p.read_text() for p in sorted(self.out.glob("*.jsonl")))

    def wait(self, read: Callable[[], Rows], done: Callable[[Rows], bool], *,
             deadline_s: float = 30.0) -> Rows:
        """``read()`` once ``done`` holds for it (a hang guard, not a timing assertion)."""
        end = time.monotonic() + deadline_s
        while True:
            rows = read()
            if done(rows):
                return rows
            if time.monotonic() > end:
                raise AssertionError(f"the receiver's rows never matched after {deadline_s}s: "
                                     f"{[r.get('name') for r in rows]}")
            time.sleep(0.1)

    def stop(self) -> None:
        terminate(self.popen)


def start_receiver(workdir: Path, *, hang: bool = False, deadline_s: float = 30.0
                   ) -> OtlpReceiver:
    port = free_port()
    out = workdir / f"otlp-{port}"
    out.mkdir(parents=True)
    log = (workdir / f"otlp-{port}.log").open("wb")
    popen = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.otlp_receiver", "--port", str(port),
         "--out", str(out), *(["--hang"] if hang else [])],
        stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=str(ROOT))
    log.close()
    receiver = OtlpReceiver(popen, port, out)
    end = time.monotonic() + deadline_s
    while True:
        if popen.poll() is not None:
            raise RuntimeError((workdir / f"otlp-{port}.log").read_text())
        try:
            if httpx.get(f"{receiver.url}/ready", timeout=2).status_code == 200:
                return receiver
        except httpx.HTTPError:
            pass
        if time.monotonic() > end:
            receiver.stop()
            raise RuntimeError("the OTLP receiver never became ready")
        time.sleep(0.1)


@contextmanager
def otlp_receiver(workdir: Path, *, hang: bool = False) -> Iterator[OtlpReceiver]:
    receiver = start_receiver(workdir, hang=hang)
    try:
        yield receiver
    finally:
        receiver.stop()


def closed_port() -> int:
    """A port with nothing listening (connections are refused)."""
    return free_port()
