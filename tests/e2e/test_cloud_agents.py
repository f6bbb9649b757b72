"""Real agents in their cloud modes through a real gateway to the cloud peer: Claude Code
in Vertex mode (``CLAUDE_CODE_USE_VERTEX=1``, ``ANTHROPIC_VERTEX_BASE_URL``,
``CLAUDE_CODE_SKIP_VERTEX_AUTH=1``, our key in ``ANTHROPIC_CUSTOM_HEADERS``) runs a tool
loop on a ``vertex`` deployment; Codex reaches an ``azure`` deployment. The agents come
from the npm registry at the pins of ``test_catalog_agents_npm.PACKAGES`` (its
``agents`` fixture); the commands are the ones docs/vertex.md and docs/azure.md show."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._cloud_peer import TOOL_MARKER
from tests.e2e._clouds import PROJECT, REGION, Clouds, running_clouds
from tests.e2e.conftest import expected_cost
from tests.e2e.test_catalog_agents_npm import _codex_argv, _env, _run
from tests.e2e.test_catalog_agents_npm import agents as agents  # the fixture, shared

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def clouds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clouds]:
    with running_clouds(tmp_path_factory.mktemp("agents")) as started:
        yield started


def _claude_argv(prefix: Path, *args: str) -> list[str]:
    package = prefix / "node_modules" / "@anthropic-ai" / "claude-code"
    wrapper = package / "cli-wrapper.cjs"
    return (["node", str(wrapper)] if wrapper.exists()
            else [str(package / "bin" / "claude.exe")]) + list(args)


def test_claude_code_in_vertex_mode_runs_a_tool_loop(agents: Path, clouds: Clouds,
                                                     tmp_path: Path) -> None:
    """Claude Code on its default Vertex model: the peer's Bash call is run and its
    output sent back on the next streamRawPredict; committed == the peer's record."""
    key = clouds.key("claude-code-vertex")
    home = tmp_path / "home"
    home.mkdir()
    clouds.clear()
    result = _run(_claude_argv(agents, "-p", f"{TOOL_MARKER}: run the tool, then stop",
                               "--allowedTools", "Bash(echo:*)"),
                  env=_env(home, CLAUDE_CODE_USE_VERTEX="1",
                           ANTHROPIC_VERTEX_BASE_URL=f"{clouds.gateway.url}/v1",
                           CLAUDE_CODE_SKIP_VERTEX_AUTH="1",
                           ANTHROPIC_VERTEX_PROJECT_ID=PROJECT, CLOUD_ML_REGION=REGION,
                           ANTHROPIC_CUSTOM_HEADERS=f"Authorization: Bearer {key}"),
                  cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
    seen = clouds.requests()
    assert all(r["path"].endswith("/models/mock-claude:streamRawPredict") for r in seen)
    assert any(r["tool_result"] for r in seen), seen
    entries = clouds.ledger()
    assert len(entries) >= 2
    assert clouds.committed_usd(key) == sum(expected_cost(e) for e in entries)


def test_codex_reaches_an_azure_deployment(agents: Path, clouds: Clouds,
                                           tmp_path: Path) -> None:
    """Codex (Responses API) on an Azure deployment: answered; committed == the peer's
    record."""
    key = clouds.key("codex-azure")
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    provider = (f'{{name="inferplane", base_url="{clouds.gateway.url}/v1", '
                f'env_key="INFERPLANE_KEY", wire_api="responses"}}')
    clouds.clear()
    result = _run(_codex_argv(agents, "exec", "--skip-git-repo-check",
                              "-c", "check_for_update_on_startup=false",
                              "-c", "model_provider=inferplane", "-c", "model=gpt-azure",
                              "-c", f"model_providers.inferplane={provider}", "say ok"),
                  env=_env(home, CODEX_HOME=str(home / ".codex"), INFERPLANE_KEY=key),
                  cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
    entries = clouds.ledger()
    assert entries and all(e["route"] == "azure:responses" for e in entries), entries
    assert clouds.committed_usd(key) == sum(expected_cost(e) for e in entries)


def test_no_secret_in_any_file_of_the_agents_run(clouds: Clouds) -> None:
    """After the agents' runs: no cloud secret or issued token in the gateway's log,
    config or data dir."""
    clouds.assert_no_secret_in_files()
