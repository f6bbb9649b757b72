"""Real Claude Code on a $1/day Opus budget: it keeps working turn after turn (issue 26).

Installs ``@anthropic-ai/claude-code`` at the pin of ``test_catalog_agents_npm.PACKAGES``
from the npm registry, starts ``mayu mock-upstream`` and ``mayu serve`` (an ``anthropic``
provider, so the input bound is refined with the upstream's own ``count_tokens``) and
runs ``claude -p`` once, then ``claude -p --continue`` (the same conversation, re-sent
and grown each time), until the gateway refuses a turn. Claude Code asks for its default
model, ``claude-opus-4-8``, priced from the catalog.

Time: ~5 s of install on a warm npm cache (~30 s cold: one package, its native binary),
~1 s per turn for ~12 turns; a 60 s budget like the catalog test's. Skipped, with the
reason, only when ``npm`` is missing or the registry does not answer ``npm ping``.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.catalog import builtin_catalog
from gateway.pricing import ModelPrice, Usage, cost_bound_micro_usd, cost_micro_usd
from tests.bench.agent_budget import MODEL, config_file
from tests.e2e._npm import require_npm
from tests.e2e._procs import (
    Proc,
    create_key,
    create_team,
    upstream_and_gateway,
)
from tests.e2e.test_catalog_agents_npm import PACKAGES

pytestmark = pytest.mark.e2e

LIMIT, FLOOR = 1_000_000, 1024
CLAUDE_CODE = next(p for p in PACKAGES if p.startswith("@anthropic-ai/claude-code@"))


@pytest.fixture(scope="module")
def claude(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The argv that starts the installed Claude Code."""
    npm = require_npm("Claude Code")
    prefix = tmp_path_factory.mktemp("claude-code")
    install = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit",
                              "--no-fund", "--loglevel=error", CLAUDE_CODE],
                             capture_output=True, text=True, timeout=240, check=False)
    assert install.returncode == 0, f"npm install failed:\n{install.stderr[-2000:]}"
    package = prefix / "node_modules" / "@anthropic-ai" / "claude-code"
    wrapper = package / "cli-wrapper.cjs"
    return ["node", str(wrapper)] if wrapper.exists() else [str(package / "bin" / "claude.exe")]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Proc, Proc, str]]:
    with upstream_and_gateway(tmp_path, lambda upstream: config_file(tmp_path, upstream, None)
                              ) as (gateway, upstream, config):
        create_team(config, "small", "--usd-micros-per-day", str(LIMIT),
                    "--budget-fit-floor", str(FLOOR))
        yield gateway, upstream, create_key(config, "small")


def test_claude_code_on_a_dollar_a_day_works_until_a_counted_turn_no_longer_fits(
        claude: list[str], stack: tuple[Proc, Proc, str], tmp_path: Path) -> None:
    """Every turn is admitted (max_tokens fitted) until what remains is below the next
    turn's counted input bound; committed equals the upstream's own record, is at least
    85 % and never above the limit, and no liability is left. (At 38a06e3, with the byte
    bound: 6 turns, 49.1 %.)"""
    gateway, upstream, key = stack
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "LANG": "C.UTF-8", "ANTHROPIC_BASE_URL": gateway.url, "ANTHROPIC_API_KEY": key,
           "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    turns, refused = 0, None
    for i in range(20):
        run = subprocess.run([*claude, "-p", f"step {i}: say ok",
                              *(["--continue"] if i else [])], env=env, cwd=project,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=45, check=False)
        if run.returncode != 0:
            refused = run.stdout + run.stderr
            break
        turns += 1
    assert refused is not None, "20 turns and never refused"
    assert turns >= 9, refused
    rows = httpx.get(f"{gateway.url}/v1/usage",
                     headers={"Authorization": f"Bearer {key}"}).json()["data"]
    team = next(r for r in rows if r["scope"] == "team" and r["window"] == "day")
    ledger = httpx.get(f"{upstream.url}/__mock/ledger").json()
    entry = builtin_catalog().get(MODEL)
    assert entry is not None and {e["model"] for e in ledger} == {"mock-claude"}
    price = ModelPrice(**{c: entry.price.per_class(c) for c in ModelPrice.__struct_fields__})
    assert team["usd_committed"] == sum(cost_micro_usd(Usage(**e["classes"]), price)
                                        for e in ledger)
    assert team["usd_liability"] == team["usd_reserved"] == 0
    assert 0.85 * LIMIT <= team["usd_committed"] <= LIMIT
    counted = re.search(r"up to (\d+) input tokens \(counted by the provider", refused)
    assert counted is not None, refused
    at_floor = cost_bound_micro_usd(int(counted.group(1)), FLOOR, entry.price,
                                    input_classes=frozenset(("input", "cache_read",
                                                             "cache_write_5m")))
    assert LIMIT - team["usd_committed"] < at_floor
    assert httpx.get(f"{upstream.url}/__mock/counts").json()["counts"] >= 1
