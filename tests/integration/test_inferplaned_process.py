"""``inferplaned`` as a real process: startup refusals, unauthenticated mode, real HTTP."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e._procs import ROOT, Proc, _env, free_port, wait_ready

pytestmark = pytest.mark.integration

TOKEN = "process-test-writer-token"


def inferplaned_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "controlplane.cli", *args]


def start_inferplaned(config: Path, env: dict[str, str]) -> Proc:
    port = free_port()
    log_path = config.parent / f"inferplaned-{port}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            inferplaned_cmd("serve", "--config", str(config), "--port", str(port)),
            stdout=log, stderr=subprocess.STDOUT, env=_env(env), cwd=str(ROOT))
    return wait_ready(Proc(popen=popen, port=port, log_path=log_path))


def write_config(tmp_path: Path, **extra: object) -> Path:
    config = {"database": {"dsn_ref": "env:IPD_DSN", "pool_min_size": 1,
                           "pool_max_size": 2}, **extra}
    path = tmp_path / "inferplaned.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop()


def test_refuses_non_loopback_without_tokens(tmp_path: Path) -> None:
    """Unauthenticated on 0.0.0.0: the process refuses to start and says why."""
    config = write_config(tmp_path, listen={"host": "0.0.0.0", "port": free_port()})
    done = subprocess.run(inferplaned_cmd("serve", "--config", str(config)),
                          capture_output=True, text=True, env=_env(), timeout=60, check=False)
    assert done.returncode == 2
    assert "listen.host" in done.stderr and "no token is configured" in done.stderr


@pytest.mark.parametrize(("section", "key"), [
    ({"auth": {"writer_tokens_ref": {"ci": "env:IPD_UNSET_VAR"}}},
     "auth.writer_tokens_ref.ci"),
    ({"identity": {"issuers": [{"issuer": "https://idp.example.com", "audience": ["x"]}],
                   "credentials": {"issuer": "https://ipd.example.com",
                                   "signing_keys_ref": ["env:IPD_UNSET_VAR"]}}},
     "identity.credentials.signing_keys_ref[0]"),
    ({"identity": {"issuers": [{"issuer": "https://idp.example.com", "audience": ["x"],
                                "algorithms": ["HS256"]}]}},
     "identity.issuers[0].algorithms[0]"),
])
def test_bad_token_reference_is_a_clear_startup_error(tmp_path: Path, section: dict[str, Any],
                                                      key: str) -> None:
    """An unset token or signing-secret variable, or an HMAC algorithm for an issuer,
    fails startup naming the config key."""
    config = write_config(tmp_path, **section)
    done = subprocess.run(inferplaned_cmd("check-config", "--config", str(config)),
                          capture_output=True, text=True, env=_env(), timeout=60, check=False)
    assert done.returncode == 2
    assert key in done.stderr


def test_help_lists_commands_and_config_keys() -> None:
    """`inferplaned --help` and `serve --help` document the API and every config key."""
    top = subprocess.run(inferplaned_cmd("--help"), capture_output=True, text=True,
                         env=_env(), timeout=60, check=True).stdout
    serve = subprocess.run(inferplaned_cmd("serve", "--help"), capture_output=True, text=True,
                           env=_env(), timeout=60, check=True).stdout
    assert "PUT    /v1alpha1/policies/{name}" in top and "check-config" in top
    for key in ("database.dsn_ref", "listen.host", "auth.writer_tokens_ref",
                "auth.reader_tokens_ref", "identity.issuers", "identity.credentials"):
        assert key in serve


def test_unauthenticated_loopback_warns_loudly(tmp_path: Path, pg_dsn: str,
                                               procs: list[Proc]) -> None:
    """No tokens on loopback: serves, logs UNAUTHENTICATED, writes are by 'unauthenticated'."""
    proc = start_inferplaned(write_config(tmp_path), {"IPD_DSN": pg_dsn})
    procs.append(proc)
    assert "UNAUTHENTICATED" in proc.logs()
    doc = {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
           "metadata": {"name": "a"}, "spec": {"rules": []}}
    r = httpx.put(f"{proc.url}/v1alpha1/policies/a", json=doc)
    assert r.status_code == 200 and r.json()["author"] == "unauthenticated"


def test_real_process_publishes_with_a_writer_token(tmp_path: Path, pg_dsn: str,
                                                    procs: list[Proc]) -> None:
    """Over real HTTP: 401 without the token, 200 with it, attributed in /changes."""
    config = write_config(tmp_path, auth={"writer_tokens_ref": {"deployer": "env:IPD_TOKEN"}})
    proc = start_inferplaned(config, {"IPD_DSN": pg_dsn, "IPD_TOKEN": TOKEN})
    procs.append(proc)
    assert "UNAUTHENTICATED" not in proc.logs()
    doc = {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
           "metadata": {"name": "a"}, "spec": {"rules": []}}
    assert httpx.put(f"{proc.url}/v1alpha1/policies/a", json=doc).status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.put(f"{proc.url}/v1alpha1/policies/a", json=doc, headers=auth)
    assert r.status_code == 200, r.text
    changes = httpx.get(f"{proc.url}/v1alpha1/changes", headers=auth).json()["changes"]
    assert [(c["name"], c["author"]) for c in changes] == [("a", "deployer")]
