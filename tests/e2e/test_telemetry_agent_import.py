"""Real Claude Code and Codex exporting their own usage to the gateway's OTLP receiver,
on the settings docs/telemetry.md gives (issue 40).

Claude Code (``@anthropic-ai/claude-code`` at ``test_catalog_agents_npm``'s pin, from the
npm registry: test_refine_claude_code's install) runs ``claude -p`` against ``mayu serve``
and ``mayu mock-upstream`` with ``CLAUDE_CODE_ENABLE_TELEMETRY=1`` and its OTLP/HTTP
exporters pointed at the gateway, authenticated by the same gateway key. What it
reports for its session must equal what the upstream reported (its ledger), appear in
the usage API beside the gateway's committed figures for the same requests, and leave
those figures as the upstream's ledger priced them: never billed. A second session sent
straight to the upstream (around the gateway) still reports to the gateway, and the
usage API flags the gap. Codex (``codex exec``, its ``[otel]`` exporter on the gateway)
reports its one request as the gateway's request log recorded it, class by class.

Time (over 30 s, measured 52-68 s on the shared 2-core machine with Claude Code alone):
the module's setup is most of it (``npm ping`` and the install of both agents from the
registry: test_catalog_agents_npm's ``agents`` fixture, ~25-40 s; then the mock upstream
and ``mayu serve``); the Claude Code test ~11 s (three ``claude -p``, each ~3 s, whose
exports are batched small with ``OTEL_LOGS_EXPORT_INTERVAL``/``OTEL_METRIC_EXPORT_INTERVAL``
and flushed when Claude Code exits), the Codex test ~5 s.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.catalog import builtin_catalog
from gateway.pricing import ModelPrice, Usage, cost_micro_usd
from tests.bench.agent_budget import MODEL, config_file
from tests.e2e._procs import Proc, create_key, create_team, start_gateway, start_mock_upstream
from tests.e2e.test_catalog_agents_npm import (
    _codex_argv,
    agents,  # noqa: F401 (its module fixture)
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc, Path]]:
    """(gateway, upstream, its config): Claude Code's model on the mock upstream, and
    ``mock-gpt`` (the built-in mock provider) for Codex; a team ``devs``."""
    workdir = tmp_path_factory.mktemp("agent-import")
    upstream = start_mock_upstream(workdir)
    gateway = None
    try:
        config = config_file(workdir, upstream, None)
        doc = yaml.safe_load(config.read_text())
        doc["providers"].append({"name": "mock", "kind": "mock"})
        doc["models"].append({"name": "mock-gpt", "deployments": [{"provider": "mock"}],
                              "price": {"input": 1_000_000, "output": 4_000_000,
                                        "cache_read": 100_000},
                              "max_input_tokens": 200_000, "max_output_tokens": 8192})
        config.write_text(yaml.safe_dump(doc))
        gateway = start_gateway(config)
        create_team(config, "devs")
        yield gateway, upstream, config
    finally:
        if gateway is not None:
            gateway.stop()
        upstream.stop()


def _telemetry_env(base_url: str, key: str, home: Path, otlp_url: str) -> dict[str, str]:
    """Claude Code's environment: docs/telemetry.md's block, the exports batched small."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "LANG": "C.UTF-8", "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": key,
            "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CODE_ENABLE_TELEMETRY": "1", "OTEL_LOGS_EXPORTER": "otlp",
            "OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_url,
            "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer {key}",
            "OTEL_LOGS_EXPORT_INTERVAL": "500", "OTEL_METRIC_EXPORT_INTERVAL": "1000"}


def _run(argv: list[str], env: dict[str, str], cwd: Path, *args: str) -> None:
    run = subprocess.run([*argv, "-p", *args], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=90, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


def _ledger_classes(upstream: Proc) -> list[dict[str, int]]:
    return [e["classes"] for e in httpx.get(f"{upstream.url}/__mock/ledger").json()]


def _reported(classes: list[dict[str, int]]) -> dict[str, int]:
    """What Claude Code reports for these requests (the API's usage, its classes)."""
    return {"reports": len(classes),
            "input_tokens": sum(c["input"] for c in classes),
            "output_tokens": sum(c["output"] for c in classes),
            "cache_read_tokens": sum(c["cache_read"] for c in classes),
            "cache_write_tokens": sum(c["cache_write_5m"] + c["cache_write_1h"]
                                      + c["cache_write_unknown"] for c in classes)}


def _mine(gateway: Proc, key: str, *, reports: int, deadline_s: float = 30.0
          ) -> dict[str, Any]:
    """``/v1/me/agent-usage`` once ``reports`` events of the key have arrived."""
    body: dict[str, Any] = {}
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        body = httpx.get(f"{gateway.url}/v1/me/agent-usage", params={"bucket": "none"},
                         headers={"Authorization": f"Bearer {key}"}).json()
        if sum(r["reported"]["reports"] for r in body["data"]) >= reports:
            return body
        time.sleep(0.25)
    raise AssertionError(f"{reports} reports not in within {deadline_s} s: {body}")


def _claude_argv(prefix: Path) -> list[str]:
    package = prefix / "node_modules" / "@anthropic-ai" / "claude-code"
    wrapper = package / "cli-wrapper.cjs"
    return ["node", str(wrapper)] if wrapper.exists() else [str(package / "bin" / "claude.exe")]


def test_claude_codes_own_report_sits_beside_the_gateways_committed_figures(
        agents: Path,  # noqa: F811 (the module fixture)
        stack: tuple[Proc, Proc, Path], tmp_path: Path) -> None:
    """Two turns of one session through the gateway: Claude Code's reported tokens per
    class equal the upstream's ledger, and the gateway committed exactly the ledger's
    tokens and price (the import billed nothing); no gap. A third request sent around
    the gateway is reported to it all the same, and flagged as a gap."""
    gateway, upstream, config = stack
    workdir, claude = config.parent, _claude_argv(agents)
    key = create_key(config, "devs", "--user", "ana")
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    env = _telemetry_env(gateway.url, key, home, gateway.url)
    _run(claude, env, project, "say ok")
    _run(claude, env, project, "say ok again", "--continue")
    classes = _ledger_classes(upstream)
    assert len(classes) == 2, classes
    body = _mine(gateway, key, reports=2)
    (row,) = body["data"]
    want = _reported(classes)
    reported = row["reported"]
    assert {k: reported[k] for k in want} == want, (reported, classes)
    total = sum(want[k] for k in want if k != "reports")
    assert reported["tokens"] == total
    entry = builtin_catalog().get(MODEL)
    assert entry is not None
    price = ModelPrice(**{c: entry.price.per_class(c) for c in ModelPrice.__struct_fields__})
    priced = sum(cost_micro_usd(Usage(**c), price) for c in classes)
    gw = row["gateway"]
    assert gw["requests"] == 2 and gw["tokens_committed"] == total
    assert gw["usd_committed"] == priced
    assert gw["tokens_liability"] == gw["usd_liability"] == gw["tokens_reserved"] == 0
    assert row["gap_tokens"] == 0 and row["bypass_suspected"] is False
    assert reported["reported_cost_uusd"] > 0  # Claude Code's own list-price estimate
    assert {s["agent"] for s in body["sessions"]} == {"claude-code"}
    usage = httpx.get(f"{gateway.url}/v1/usage",
                      headers={"Authorization": f"Bearer {key}"}).json()["data"]
    team = next(r for r in usage if r["scope"] == "team" and r["window"] == "day")
    assert team["usd_committed"] == priced and team["usd_reserved"] == 0

    # Around the gateway: the upstream directly, the usage still reported to the gateway.
    around = _telemetry_env(upstream.url, key, home, gateway.url)
    _run(claude, {**around, "ANTHROPIC_MODEL": "mock-claude"}, project, "say ok directly")
    bypassed = _ledger_classes(upstream)[2:]
    assert len(bypassed) == 1, bypassed
    (row,) = _mine(gateway, key, reports=3)["data"]
    assert row["gateway"]["tokens_committed"] == total  # nothing went through it
    assert row["gap_tokens"] == sum(v for k, v in _reported(bypassed).items()
                                    if k != "reports")
    assert row["bypass_suspected"] is True
    # The key rode in the exporters' headers: never in the gateway's files.
    for path in workdir.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path


def test_codexs_own_report_matches_the_gateways_request_log(
        agents: Path,  # noqa: F811 (the module fixture)
        stack: tuple[Proc, Proc, Path], tmp_path: Path) -> None:
    """``codex exec`` through the gateway with its OTLP exporter on the gateway: its
    ``codex.sse_event`` (response.completed) is stored as uncached input, cache reads and
    output equal to what the gateway's request log recorded for that request; no cost
    reported, so no money gap."""
    gateway, _, config = stack
    key = create_key(config, "devs", "--user", "cy")
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    provider = (f'{{name="gw", base_url="{gateway.url}/v1", env_key="GW_KEY", '
                f'wire_api="responses", request_max_retries=0, stream_max_retries=0}}')
    exporter = (f'{{otlp-http={{endpoint="{gateway.url}/v1/logs", protocol="binary", '
                f'headers={{"Authorization"="Bearer {key}"}}}}}}')
    argv = _codex_argv(agents, "exec", "--skip-git-repo-check",
                       "-c", "check_for_update_on_startup=false", "-c", "model_provider=gw",
                       "-c", f"model_providers.gw={provider}", "-m", "mock-gpt",
                       "-c", f"otel.exporter={exporter}", "say ok")
    run = subprocess.run(argv, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                    "HOME": str(home), "LANG": "C.UTF-8", "GW_KEY": key,
                                    "CODEX_HOME": str(home / ".codex")},
                         cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    body = _mine(gateway, key, reports=1)
    (request,) = httpx.get(f"{gateway.url}/v1/me/requests",
                           headers={"Authorization": f"Bearer {key}"}).json()["data"]
    (row,) = body["data"]
    reported = row["reported"]
    assert (reported["input_tokens"], reported["cache_read_tokens"],
            reported["output_tokens"]) == (request["input_tokens"],
                                           request["cache_read_tokens"],
                                           request["output_tokens"]), (reported, request)
    assert reported["tokens"] == row["gateway"]["tokens_committed"] > 0
    assert row["gap_tokens"] == 0 and row["bypass_suspected"] is False
    assert reported["reported_cost_uusd"] is None and row["gap_uusd"] is None
    assert [s["agent"] for s in body["sessions"]] == ["codex"]
