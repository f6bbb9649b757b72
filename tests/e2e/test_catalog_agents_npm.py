"""The coding agents' default models are in the built-in catalog.

Installs ``@openai/codex`` and ``@anthropic-ai/claude-code`` at the versions in
:data:`PACKAGES` (pinned: CI must not fail because the registry moved on; moving the pin
to a new release is how that release is checked) from the npm registry into a temporary
prefix, runs each one once against a capture server on 127.0.0.1 and reads the ``model``
of every request it sends: that is what the agent asks a gateway for when its config
names no model. A model the catalog lacks is a 404 through the gateway (or, served
without figures, the 400 that asks for ``max_input_tokens``), so a release whose default
the catalog lacks fails here once it is pinned.

Why a real run and not a constant: both packages ship native binaries whose defaults are
computed (Codex picks the first model of its bundled list by priority after filtering by
auth; Claude Code picks per provider and key kind), so the request body is the one
robust place to read them. The run is the slow part only because of ``npm install``
(~650 MB of binaries, ~30 s on a cold npm cache): hence the module-scoped install and a
budget of 60 s for the module rather than the usual 30.

Skipped, with the reason, only when ``npm`` is not installed or the registry does not
answer ``npm ping``; any other install failure fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gateway.catalog import builtin_catalog
from tests.e2e._http import QuietHandler
from tests.e2e._npm import require_npm

pytestmark = pytest.mark.e2e

PACKAGES = ("@openai/codex@0.171.0", "@anthropic-ai/claude-code@2.1.197")
CATALOG = builtin_catalog()
RUN_TIMEOUT = 45  # one agent run; each took 2-7 s here
PROMPT_HOOK = {"hooks": {"UserPromptSubmit": [{"hooks": [
    {"type": "prompt", "prompt": "Is this request fine? $ARGUMENTS"}]}]}}
"""A prompt-type hook runs on Claude Code's small/fast model: a run that fires it shows
which model that is, next to the main model of the turn itself."""


@dataclass
class Capture:
    """A loopback HTTP server that records the ``model`` of every JSON request body."""

    models: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def clear(self) -> None:
        self.models.clear()
        self.paths.clear()


def _anthropic_reply(model: str, *, stream: bool) -> tuple[str, bytes]:
    """A minimal successful Messages answer, so Claude Code ends its turn normally."""
    message: dict[str, Any] = {
        "id": "msg_capture", "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1}}
    if not stream:
        done = {**message, "content": [{"type": "text", "text": "ok"}],
                "stop_reason": "end_turn"}
        return "application/json", json.dumps(done).encode()
    events = [
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "ok"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": 1}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    body = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)
    return "text/event-stream", body.encode()


def _handler(capture: Capture) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            capture.paths.append(f"GET {self.path}")
            self.send(404, "application/json", b'{"error": {"message": "not here"}}')

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            capture.paths.append(f"POST {self.path}")
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = {}
            model = doc.get("model") if isinstance(doc, dict) else None
            if isinstance(model, str):
                capture.models.append(model)
            if self.path.startswith("/v1/messages") and isinstance(model, str):
                self.send(200, *_anthropic_reply(model, stream=bool(doc.get("stream"))))
                return
            # Codex: the model is read; a 400 ends its turn at once (no retries configured).
            self.send(400, "application/json",
                       b'{"error": {"message": "capture only", "type": "invalid_request_error"}}')

    return Handler


@pytest.fixture(scope="module")
def capture() -> Iterator[Capture]:
    cap = Capture()
    cap.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(cap))
    thread = threading.Thread(target=cap.server.serve_forever, daemon=True)
    thread.start()
    yield cap
    cap.server.shutdown()
    cap.server.server_close()


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both agents installed from the npm registry into a fresh prefix."""
    npm = require_npm("@openai/codex and @anthropic-ai/claude-code")
    prefix = tmp_path_factory.mktemp("agents")
    install = subprocess.run(
        [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
         "--loglevel=error", *PACKAGES],
        capture_output=True, text=True, timeout=240, check=False)
    assert install.returncode == 0, f"npm install failed:\n{install.stderr[-2000:]}"
    return prefix


def _version(prefix: Path, package: str) -> str:
    meta = json.loads((prefix / "node_modules" / package / "package.json").read_text())
    return f"{package}@{meta['version']}"


def _env(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment: no key, endpoint or model setting leaks in from the caller."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "LANG": "C.UTF-8", **extra}


def _run(argv: list[str], *, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)


def _missing(models: list[str]) -> list[str]:
    return sorted({m for m in models if CATALOG.get(m) is None})


def _codex_argv(prefix: Path, *args: str) -> list[str]:
    return ["node", str(prefix / "node_modules" / "@openai" / "codex" / "bin" / "codex.js"),
            *args]


def _codex_exec(prefix: Path, cwd: Path, *, provider: str, base_url: str, key: str,
                settings: str = "") -> subprocess.CompletedProcess[str]:
    """Codex (``exec "say ok"``, a fresh home under ``cwd``) against ``base_url`` as the
    custom provider ``provider`` (Responses wire API, ``settings`` added to its table),
    its key ``key`` in ``<PROVIDER>_KEY``."""
    home = cwd / "home"
    (home / ".codex").mkdir(parents=True)
    env_key = f"{provider.upper()}_KEY"
    table = (f'{{name="{provider}", base_url="{base_url}/v1", env_key="{env_key}", '
             f'wire_api="responses"{settings}}}')
    return _run(_codex_argv(prefix, "exec", "--skip-git-repo-check",
                            "-c", "check_for_update_on_startup=false",
                            "-c", f"model_provider={provider}",
                            "-c", f"model_providers.{provider}={table}", "say ok"),
                env=_env(home, CODEX_HOME=str(home / ".codex"), **{env_key: key}), cwd=cwd)


def test_codex_default_model_is_in_the_catalog(agents: Path, capture: Capture,
                                               tmp_path: Path) -> None:
    """What the installed Codex CLI asks a custom provider for by default is a catalog id."""
    capture.clear()
    result = _codex_exec(agents, tmp_path, provider="capture", base_url=capture.url,
                         key="sk-capture",
                         settings=", request_max_retries=0, stream_max_retries=0")
    version = _version(agents, "@openai/codex")
    assert capture.models, (f"{version} sent no request with a model ({capture.paths}):\n"
                            f"{result.stdout[-1500:]}\n{result.stderr[-1500:]}")
    assert not _missing(capture.models), (
        f"{version} asks by default for {_missing(capture.models)}, which the catalog lacks: "
        "add it to gateway/catalog/models.yaml (with its source) and docs/models.md")


def test_codex_listed_models_missing_from_the_catalog_are_reported(agents: Path,
                                                                    tmp_path: Path) -> None:
    """Every model Codex's picker lists is in the catalog, or a warning names the rest."""
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    result = _run(_codex_argv(agents, "debug", "models", "--bundled"),
                  env=_env(home, CODEX_HOME=str(home / ".codex")), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-1500:]
    listed = [m["slug"] for m in json.loads(result.stdout)["models"]
              if m.get("visibility") == "list"]
    assert listed, "codex debug models --bundled listed no model"
    # A warning, not a failure: a model Codex merely offers in its picker is asked for
    # only when a user picks it; the default (the test above) is what must never 404.
    if missing := _missing(listed):
        warnings.warn(f"{_version(agents, '@openai/codex')} lists models the catalog lacks: "
                      f"{missing}", stacklevel=1)


def _claude_argv(prefix: Path) -> list[str]:
    package = prefix / "node_modules" / "@anthropic-ai" / "claude-code"
    wrapper = package / "cli-wrapper.cjs"
    # The wrapper finds the platform binary itself; npm may not have run the postinstall
    # that would copy it over bin/claude.exe (install scripts need approval in npm 11).
    start = ["node", str(wrapper)] if wrapper.exists() else [str(package / "bin" / "claude.exe")]
    return [*start, "-p", "say ok", "--settings", json.dumps(PROMPT_HOOK)]


@pytest.mark.parametrize(("key_kind", "credentials"), [
    # A gateway key, sent as Authorization: Bearer (docs/models.md): Claude Code then
    # runs its small/fast tasks on the main model unless ANTHROPIC_DEFAULT_HAIKU_MODEL is set.
    ("gateway bearer token", {"ANTHROPIC_AUTH_TOKEN": "sk-inf-capture"}),
    # An Anthropic API key: Claude Code's small/fast default (the Haiku snapshot) shows.
    ("Anthropic API key", {"ANTHROPIC_API_KEY": "sk-ant-api03-capture-only"}),
])
def test_claude_code_default_models_are_in_the_catalog(agents: Path, capture: Capture,
                                                       tmp_path: Path, key_kind: str,
                                                       credentials: dict[str, str]) -> None:
    """Claude Code's default main and small/fast models, as it asks for them, are catalog ids."""
    capture.clear()
    home = tmp_path / "home"
    home.mkdir()
    result = _run(_claude_argv(agents),
                  env=_env(home, ANTHROPIC_BASE_URL=capture.url, DISABLE_AUTOUPDATER="1",
                           CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", **credentials),
                  cwd=tmp_path)
    version = _version(agents, "@anthropic-ai/claude-code")
    assert len(capture.models) >= 2, (
        f"{version} ({key_kind}) sent {capture.models} ({capture.paths}); expected the "
        f"prompt hook's and the turn's requests:\n{result.stdout[-1500:]}\n"
        f"{result.stderr[-1500:]}")
    assert not _missing(capture.models), (
        f"{version} ({key_kind}) asks by default for {_missing(capture.models)}, which the "
        "catalog lacks: add it to gateway/catalog/models.yaml (with its source) and "
        "docs/models.md")


def _codex_on_a_team(agents: Path, tmp_path: Path, *, usd_micros_per_day: int
                     ) -> tuple[subprocess.CompletedProcess[str], float, list[dict[str, Any]]]:
    """Real Codex (``exec "say ok"``, its default retries) against a ``mayu serve`` of the
    in-process mock's gpt-6.2-sol, with a key of a team limited to ``usd_micros_per_day``:
    Codex's result, the time it ended, and the gateway's audit lines."""
    import time

    import yaml

    from tests.e2e._procs import create_key, create_team, start_gateway

    config = tmp_path / "mayu.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"), "demo": False,
        "providers": [{"name": "in-process", "kind": "mock"}],
        "models": [{"name": "gpt-6.2-sol", "deployments": [{"provider": "in-process"}]}]}))
    create_team(config, "t", "--usd-micros-per-day", str(usd_micros_per_day))
    key = create_key(config, "t")
    gateway = start_gateway(config)
    try:
        result = _codex_exec(agents, tmp_path, provider="inferplane", base_url=gateway.url,
                             key=key)
        ended = time.time()
    finally:
        gateway.stop()
    audit = [json.loads(line) for f in sorted((tmp_path / "data").glob("audit-*.jsonl"))
             for line in f.read_text().splitlines() if line.strip()]
    return result, ended, audit


def test_codex_stops_at_once_on_a_spent_budget(agents: Path, tmp_path: Path) -> None:
    """Issue 26: Codex with its default retries, against a real ``mayu serve`` whose team
    budget cannot fit a request (1 µUSD a day), sends the request once (the gateway
    audits exactly one refusal and dispatches nothing), exits non-zero within 5 s of
    that refusal and says the usage limit is hit and when to try again. (Codex retries a
    402 five times, ~6.5 s; the gateway answers it the 429 usage_limit_reached it stops
    on: gateway/ingress/_render.py codex_usage_limit.)"""
    result, ended, audit = _codex_on_a_team(agents, tmp_path, usd_micros_per_day=1)
    refusals = [a for a in audit if a.get("status") in (402, 429)]
    output = result.stdout + result.stderr
    assert len(refusals) == 1, (len(refusals), output[-2000:])
    assert not [a for a in audit if a.get("event") == "dispatch"], "something was dispatched"
    assert result.returncode != 0, output[-2000:]
    refused_at = datetime.fromisoformat(refusals[0]["ts"]).timestamp()
    assert ended - refused_at < 5, (ended - refused_at, output[-2000:])
    assert "usage limit" in output and "Try again at" in output, output[-2000:]


def test_codex_told_its_own_bound_is_too_large_is_never_told_its_limit_is_hit(
        agents: Path, tmp_path: Path) -> None:
    """Issue 33: real Codex on its default model and a $1/day team that has spent
    nothing names no output limit, so its worst case (the 128k ceiling) passes the whole
    limit: Codex stops at once with the gateway's 400 saying which max_output_tokens
    would fit, never "You've hit your usage limit" (nothing is spent; no reset helps)."""
    result, _, audit = _codex_on_a_team(agents, tmp_path, usd_micros_per_day=1_000_000)
    output = result.stdout + result.stderr
    refusals = [a for a in audit if a.get("event") == "refused"]
    assert len(refusals) == 1, (len(refusals), output[-2000:])
    assert result.returncode != 0, output[-2000:]
    assert "usage limit" not in output.lower(), output[-2000:]
    assert "Set max_output_tokens <= " in output, output[-2000:]
