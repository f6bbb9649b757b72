"""The agents' side of identity: ``mayu login`` (device grant), ``mayu credential``, and
real Claude Code and Codex on docs/identity.md's settings, as written.

Real processes: the OIDC provider, inferplaned and one shared gateway
(tests/e2e/_identity.py), the ``mayu`` CLI, Claude Code from the npm registry
and Codex from the npm registry (test_refine_claude_code's and test_catalog_agents_npm's
installs). The doc's blocks are read from docs/identity.md and used with only the
gateway's URL pointed at the test gateway.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import psycopg
import pytest

from tests.e2e._controlplane import MODEL, SharedStack
from tests.e2e._identity import identity_stack
from tests.e2e._oidc import CLIENT_ID, OidcProvider
from tests.e2e._procs import ROOT, _env, mayu_cmd, run_cli, wait_none_pending
from tests.e2e.test_catalog_agents_npm import (
    _codex_argv,
    agents,  # noqa: F401 (its module fixture)
)
from tests.e2e.test_refine_claude_code import claude  # noqa: F401 (its module fixture)

pytestmark = pytest.mark.e2e

USER = "hal-sub@example.com"


@pytest.fixture(scope="module")
def stack(oidc: OidcProvider, pg_module_dsn: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedStack]:
    yield from identity_stack(oidc, pg_module_dsn, tmp_path_factory.mktemp("agents"),
                              gateways=1)


@pytest.fixture(scope="module")
def cache(stack: SharedStack, oidc: OidcProvider,
          tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hal signed in with ``mayu login`` (the device page visited as the browser would)."""
    assert stack.control is not None
    path = tmp_path_factory.mktemp("home") / "credentials.json"
    oidc.sign_in("hal-sub", groups=["eng"])
    login = subprocess.Popen(
        mayu_cmd("login", "--team", "eng"), stderr=subprocess.PIPE, text=True,
        stdout=subprocess.DEVNULL,
        env=_env({"MAYU_OIDC_ISSUER": oidc.issuer, "MAYU_OIDC_CLIENT_ID": CLIENT_ID,
                  "MAYU_BROKER": stack.control.url, "MAYU_CREDENTIALS": str(path)}))
    assert login.stderr is not None
    first = login.stderr.readline()
    url = re.search(r"open (\S+)", first)
    assert url is not None, first
    assert httpx.get(url.group(1), timeout=30).status_code == 200
    assert login.wait(timeout=60) == 0, login.stderr.read()
    assert "Signed in as hal-sub@example.com (team eng)" in login.stderr.read()
    return path


def test_login_caches_a_session_only_its_owner_reads(cache: Path) -> None:
    """The cache file is 0600 and holds a credential for hal in eng."""
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    session = json.loads(cache.read_text())
    claims = jwt.decode(session["credential"], options={"verify_signature": False})
    assert (claims["sub"], claims["team"], session["user"]) == (USER, "eng", USER)


def test_credential_prints_the_cached_one_then_refreshes(stack: SharedStack,
                                                         cache: Path) -> None:
    """``mayu credential`` prints the cached credential while it is valid long enough;
    asked for more validity than it has, it refreshes through the IdP and inferplaned
    (a new credential, which the gateway admits)."""
    env = {"MAYU_CREDENTIALS": str(cache)}
    first = run_cli("credential", env=env)
    assert first.returncode == 0, first.stderr
    again = run_cli("credential", env=env)
    assert again.stdout == first.stdout
    fresh = run_cli("credential", "--min-valid", "86400", env=env)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.strip() and fresh.stdout != first.stdout
    r = httpx.post(f"{stack.gateways[0].url}/v1/chat/completions", timeout=30,
                   headers={"Authorization": f"Bearer {fresh.stdout.strip()}"},
                   json={"model": MODEL, "max_tokens": 8,
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text


def _doc_block(marker: str, lang: str) -> str:
    """The fenced ``lang`` block after ``<!-- identity:<marker> -->`` in docs/identity.md."""
    text = (ROOT / "docs" / "identity.md").read_text()
    block = re.search(rf"<!-- identity:{marker} -->\n```{lang}\n(.*?)```", text, re.S)
    assert block is not None, f"docs/identity.md lost its {marker} block"
    return block.group(1)


def _doc_settings() -> dict[str, object]:
    """docs/identity.md's Claude Code settings block."""
    settings: dict[str, object] = json.loads(_doc_block("claude-settings", "json"))
    return settings


def _permits(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM permits").fetchone()
    assert row is not None
    return int(row[0])


def _users(dsn: str) -> list[tuple[str, bool]]:
    """(user, brokered) of the keys every permit so far was admitted with."""
    wait_none_pending(dsn)
    with psycopg.connect(dsn) as conn:
        return [(str(u), bool(b)) for u, b in conn.execute(
            "SELECT DISTINCT k.user_name, k.brokered FROM permits p JOIN keys k "
            "ON k.id = p.key_id").fetchall()]


def test_claude_code_on_the_documented_api_key_helper_spends_as_the_person(
        stack: SharedStack, cache: Path, claude: list[str], tmp_path: Path) -> None:  # noqa: F811
    """Claude Code with the doc's ``apiKeyHelper: mayu credential`` answers through the
    gateway; the requests are hal's (brokered key, request log) and /v1/me shows spend."""
    settings = _doc_settings()
    env_block = settings["env"]
    assert isinstance(env_block, dict)
    env_block["ANTHROPIC_BASE_URL"] = stack.gateways[0].url
    home, project = tmp_path / "home", tmp_path / "project"
    (home / ".claude").mkdir(parents=True)
    project.mkdir()
    (home / ".claude" / "settings.json").write_text(json.dumps(settings))
    bin_dir = str(Path(sys.executable).parent)  # where the `mayu` script is installed
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "HOME": str(home), "LANG": "C.UTF-8", "MAYU_CREDENTIALS": str(cache),
           "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
           "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL}
    before = _permits(stack.dsn)
    run = subprocess.run([*claude, "-p", "say ok"], env=env, cwd=project,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-1500:] + run.stderr[-1500:]
    assert _users(stack.dsn) == [(USER, True)] and _permits(stack.dsn) > before
    credential = run_cli("credential", env={"MAYU_CREDENTIALS": str(cache)}).stdout.strip()
    me = httpx.get(f"{stack.gateways[0].url}/v1/me", timeout=30,
                   headers={"Authorization": f"Bearer {credential}"}).json()
    assert USER in json.dumps(me)


def test_codex_on_the_documented_provider_settings_spends_as_the_person(
        stack: SharedStack, cache: Path, agents: Path, tmp_path: Path) -> None:  # noqa: F811
    """Codex with the doc's config.toml and ``INFERPLANE_CREDENTIAL=$(mayu credential
    --min-valid 3000)`` answers through the gateway as hal."""
    config = _doc_block("codex-config", "toml").replace(
        "http://127.0.0.1:4000", stack.gateways[0].url)
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(config)
    fresh = run_cli("credential", "--min-valid", "3000", env={"MAYU_CREDENTIALS": str(cache)})
    assert fresh.returncode == 0, fresh.stderr
    before = _permits(stack.dsn)
    run = subprocess.run(
        _codex_argv(agents, "exec", "--skip-git-repo-check", "-c",
                    "check_for_update_on_startup=false", "-c", f'model="{MODEL}"', "say ok"),
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
             "LANG": "C.UTF-8", "CODEX_HOME": str(home / ".codex"),
             "INFERPLANE_CREDENTIAL": fresh.stdout.strip()},
        cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=120, check=False)
    assert run.returncode == 0, run.stdout[-1500:] + run.stderr[-1500:]
    assert _users(stack.dsn) == [(USER, True)] and _permits(stack.dsn) > before
