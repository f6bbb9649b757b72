"""The guardrail webhook checker against a real HTTP checker: allow, block, and a slow
or unreachable checker under ``failure: open`` and ``failure: closed``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.app import create_app
from gateway.guardrails import GuardrailSettings
from tests.e2e._procs import free_port
from tests.integration._admin import gateway_settings
from tests.integration._inapp import in_app

SEEN: list[dict[str, Any]] = []


class _Checker(BaseHTTPRequestHandler):
    """Blocks text naming ``project-x``; takes 2 s on text saying ``slowly``."""

    def do_POST(self) -> None:  # noqa: N802 — http.server's name
        doc = json.loads(self.rfile.read(int(self.headers["content-length"])))
        SEEN.append(doc)
        text = " ".join(t["text"] for t in doc["texts"])
        if "slowly" in text:
            time.sleep(2)
        verdict = ({"action": "block", "detector": "project-x"} if "project-x" in text
                   else {"action": "allow"})
        body = json.dumps(verdict).encode()
        self.wfile.write(b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), body))

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def checker() -> Iterator[str]:
    with ThreadingHTTPServer(("127.0.0.1", 0), _Checker) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}/check"
        server.shutdown()


@pytest.mark.parametrize("failure", ["open", "closed"])
async def test_webhook_checker_verdicts_and_failure_policy(
        request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        checker: str, failure: str) -> None:
    """allow → served; block → 400 naming the checker's detector; a checker past its
    timeout, or unreachable, → served (``open``) or 503 guardrail_unavailable
    (``closed``); the checker sees the text after masking, never the masked value."""
    down = f"http://127.0.0.1:{free_port()}/check"
    results: dict[str, Any] = {}
    for url, name in ((checker, "up"), (down, "down")):
        guardrails = msgspec.convert({"enabled": True, "webhook": {
            "url": url, "failure": failure, "timeout_s": 0.5}}, GuardrailSettings)
        settings = gateway_settings(request, tmp_path / name, monkeypatch, profile="local")
        app = create_app(replace(settings, guardrails=guardrails))
        async with AsyncTestClient(app=app) as client:
            store = app.state.gateway.key_store
            in_app(client, store.create_team, name="t")
            key = in_app(client, store.create_key, team="t")[0]

            async def ask(text: str, client: Any = client, key: str = key) -> Any:
                return await client.post(
                    "/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                    json={"model": "mock-gpt", "max_tokens": 8,
                          "messages": [{"role": "user", "content": text}]})
            if name == "up":
                SEEN.clear()
                results["allow"] = await ask("hello, mail bob@example.org")
                results["block"] = await ask("status of project-x please")
                results["slow"] = await ask("answer slowly")
            else:
                results["down"] = await ask("hello")
            results[f"metrics-{name}"] = (await client.get("/metrics")).text
    assert results["allow"].status_code == 200
    assert "[EMAIL]" in json.dumps(SEEN[0]) and "bob@example.org" not in json.dumps(SEEN)
    assert results["block"].status_code == 400
    assert "webhook:project-x" in results["block"].json()["error"]["message"]
    want = 200 if failure == "open" else 503
    for case in ("slow", "down"):
        assert results[case].status_code == want, (case, results[case].text)
        if want == 503:
            assert results[case].json()["error"]["code"] == "guardrail_unavailable"
    outcome = f'mayu_guardrails_webhook_total{{outcome="failed_{failure}"}} 1.0'
    assert outcome in results["metrics-up"] and outcome in results["metrics-down"]
