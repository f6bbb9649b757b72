"""``mayu serve`` as a real process under signals: SIGHUP is survived, SIGTERM drains.

SIGTERM during a long stream (the mock's ``slow-stream`` with extra per-chunk latency,
about 10 s: longer than the 5 s uvicorn grace the gateway used to hard-code) stops new
connections at once while the stream runs to its end, and then the process exits.
The draining flag itself (``app.state.draining`` → ``/readyz`` 503) is pinned in-process
at the end, since a draining process refuses the new connection a probe would open.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from litestar import Litestar
from litestar.testing import TestClient

from gateway.config import ServerSettings, Settings
from gateway.ingress import ROUTES
from gateway.server import GatewayServer, uvicorn_config
from tests.e2e._procs import Proc, create_key, create_team, start_gateway

pytestmark = pytest.mark.e2e

LATENCY_MS = 150  # per chunk, on top of slow-stream's 0.1 s x 40 chunks: ~10 s in all


def _config(tmp_path: Path, **server: Any) -> Path:
    path = tmp_path / "mayu.yaml"
    path.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"), "demo": False,
        "server": {"shutdown_grace_s": 30, **server},
        "providers": [{"name": "local", "kind": "mock", "latency_ms": LATENCY_MS}],
        "models": [{"name": "slow", "max_input_tokens": 100_000,
                    "deployments": [{"provider": "local",
                                     "upstream_model": "mock-slow-stream"}]},
                   {"name": "fast", "deployments": [{"provider": "local",
                                                     "upstream_model": "mock-gpt"}]}]}))
    return path


@pytest.fixture
def gateway(tmp_path: Path) -> Any:
    config = _config(tmp_path)
    create_team(config, "t")
    key = create_key(config, "t")
    proc = start_gateway(config)
    try:
        yield proc, key
    finally:
        proc.stop()


def _chat(proc: Proc, key: str, model: str, **extra: Any) -> httpx.Response:
    return httpx.post(f"{proc.url}/v1/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": model, "max_tokens": 64, **extra,
                            "messages": [{"role": "user", "content": "hi"}]})


def test_sighup_does_not_kill_the_gateway(gateway: tuple[Proc, str]) -> None:
    """SIGHUP is logged as 'reload not supported' and the gateway keeps serving."""
    proc, key = gateway
    proc.popen.send_signal(signal.SIGHUP)
    time.sleep(0.5)
    assert proc.popen.poll() is None, proc.logs()
    assert httpx.get(f"{proc.url}/readyz", timeout=5).status_code == 200
    assert _chat(proc, key, "fast").status_code == 200
    assert "reload is not supported" in proc.logs()


def _refused(url: str) -> bool:
    try:
        httpx.get(f"{url}/readyz", timeout=1)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False


def test_sigterm_refuses_new_connections_and_lets_a_long_stream_finish(
        gateway: tuple[Proc, str]) -> None:
    """SIGTERM mid-stream: new connections are refused within a second, the ~10 s
    stream still ends with its usage chunk and [DONE], and the process then exits."""
    proc, key = gateway
    lines: list[str] = []
    first = threading.Event()
    failure: list[BaseException] = []

    def stream() -> None:
        try:
            with httpx.stream("POST", f"{proc.url}/v1/chat/completions", timeout=60,
                              headers={"Authorization": f"Bearer {key}"},
                              json={"model": "slow", "max_tokens": 64, "stream": True,
                                    "stream_options": {"include_usage": True},
                                    "messages": [{"role": "user", "content": "hi"}]}) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                        first.set()
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
            first.set()

    reader = threading.Thread(target=stream)
    started = time.monotonic()
    reader.start()
    assert first.wait(15), "no first chunk"
    proc.popen.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    while not _refused(proc.url):
        assert time.monotonic() - signalled < 1.5, "still accepting connections"
        time.sleep(0.05)
    assert reader.is_alive(), "the stream ended before the drain was observed"
    reader.join(60)
    assert not failure, failure
    elapsed = time.monotonic() - started
    assert lines[-1] == "data: [DONE]"
    usage = [json.loads(x[6:]) for x in lines[:-1] if '"usage"' in x]
    assert usage and usage[-1]["usage"]["completion_tokens"] > 0
    assert elapsed > 6, f"stream took {elapsed:.1f}s: too short to prove the grace"
    # uvicorn re-raises the signal once drained: the process ends as SIGTERM asked.
    assert proc.popen.wait(30) == -signal.SIGTERM


def test_the_drain_hook_sets_the_flag_and_readyz_fails() -> None:
    """handle_exit(SIGTERM) runs the drain hook before uvicorn's own exit, and a
    draining app answers /readyz with 503."""
    app = Litestar(route_handlers=ROUTES)
    # A started gateway as readiness reads it: present, with its settings (the standalone
    # warning is read from them).
    app.state.gateway = SimpleNamespace(settings=Settings())
    with TestClient(app=app) as client:
        assert client.get("/readyz").status_code == 200
        server = GatewayServer(uvicorn.Config(app), on_drain=lambda: setattr(
            app.state, "draining", True))
        server.handle_exit(signal.SIGTERM, None)
        assert server.should_exit and app.state.draining
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json() == {"status": "draining"}


def test_uvicorn_gets_the_configured_grace_and_limits() -> None:
    """The server's uvicorn config carries server.shutdown_grace_s, the keep-alive and
    the connection limit from the settings (the grace was hard-coded to 5 s)."""
    settings = ServerSettings(shutdown_grace_s=42.5, keep_alive_s=7,
                              max_connections=123)
    config = uvicorn_config(Litestar(), settings, log_level="warning")
    assert config.timeout_graceful_shutdown == 42.5
    assert config.timeout_keep_alive == 7 and config.limit_concurrency == 123
