"""``mayu config check`` runs every check ``mayu serve`` runs, and never prints a secret.

Real subprocesses of both commands on the same files: whatever serve refuses before it
starts, config check refuses with the same line; a good file says "config ok". The
``--database`` check runs against the real Postgres.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-live-this-must-never-be-printed-0123456789"
MODEL = {"name": "m", "deployments": [{"provider": "local"}]}


def mayu(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=120, check=False)


def write(tmp_path: Path, doc: dict[str, Any], name: str = "mayu.yaml") -> Path:
    doc = {"data_dir": str(tmp_path / "data"), "demo": False,
           "providers": [{"name": "local", "kind": "mock"}], "models": [MODEL], **doc}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def errors(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.strip()]


def both(tmp_path: Path, config: Path, **env: str) -> tuple[subprocess.CompletedProcess[str],
                                                            subprocess.CompletedProcess[str]]:
    check = mayu(tmp_path, "config", "check", "--config", str(config), **env)
    serve = mayu(tmp_path, "serve", "--config", str(config), "--port", "0", **env)
    return check, serve


@pytest.mark.parametrize("doc", [
    {"server": {"admin_token_ref": "env:IPT_UNSET_ADMIN_TOKEN"}},
    {"server": {"metrics_token_ref": "file:/nonexistent/metrics-token"}},
    {"providers": [{"name": "local", "kind": "openai", "base_url": "http://127.0.0.1:9/v1",
                    "api_key_ref": "env:IPT_UNSET_PROVIDER_KEY"}]},
    {"server": {"port": 83876}},
    {"database": {"pool_min_size": 0}},
    {"server": {"workers": 0}},
    {"server": {"workers": 2}, "control_plane": {"url": "http://127.0.0.1:9"}},
    {"server": {"workers": 2, "admin_token_ref": "env:IPT_UNSET_ADMIN_TOKEN"}},
], ids=["admin-token", "metrics-token", "provider-key", "port", "pool", "workers",
        "lease-workers", "workers-admin-token"])
def test_config_check_refuses_what_serve_refuses(tmp_path: Path, doc: dict[str, Any]) -> None:
    """Each config serve refuses at startup, config check refuses with the same line."""
    check, serve = both(tmp_path, write(tmp_path, doc))
    assert check.returncode == serve.returncode == 2, (check.stderr, serve.stderr)
    assert errors(check) == errors(serve) and len(errors(check)) == 1, (check.stderr,
                                                                        serve.stderr)
    assert "config ok" not in check.stdout


def test_config_check_says_how_many_worker_processes(tmp_path: Path) -> None:
    done = mayu(tmp_path, "config", "check", "--config",
                str(write(tmp_path, {"server": {"workers": 3}})))
    assert done.returncode == 0, done.stderr
    assert ("profile: local (SQLite key store and governance, one file; 3 worker processes "
            "on this host)") in done.stdout


def test_inline_secrets_are_refused_and_never_printed(tmp_path: Path) -> None:
    """An inline API key or admin token is refused naming its key, and the value appears
    in no output of either command."""
    for doc in ({"server": {"admin_token_ref": SECRET}},
                {"providers": [{"name": "local", "kind": "openai", "api_key_ref": SECRET,
                                "base_url": "http://127.0.0.1:9/v1"}]}):
        check, serve = both(tmp_path, write(tmp_path, doc))
        assert check.returncode == serve.returncode == 2
        assert "never inline" in check.stderr
        for done in (check, serve):
            assert SECRET not in done.stdout + done.stderr


def test_a_good_config_prints_references_but_no_values(tmp_path: Path) -> None:
    """Resolving references are shown by name; neither the values nor a URL's
    credentials are printed."""
    token = tmp_path / "metrics-token"
    token.write_text("metrics-" + SECRET)
    config = write(tmp_path, {
        "server": {"admin_token_ref": "env:IPT_ADMIN", "metrics_token_ref": f"file:{token}"},
        "providers": [{"name": "local", "kind": "openai", "api_key_ref": "env:IPT_KEY",
                       "base_url": "https://user:hunter2-password@api.example/v1"}]})
    done = mayu(tmp_path, "config", "check", "--config", str(config),
                IPT_ADMIN="admin-" + SECRET, IPT_KEY="key-" + SECRET)
    assert done.returncode == 0, done.stderr
    assert "config ok" in done.stdout and "env:IPT_KEY (resolves)" in done.stdout
    assert SECRET not in done.stdout + done.stderr
    assert "hunter2" not in done.stdout and "***@api.example" in done.stdout


def test_invalid_policy_files_fail_check_like_serve(tmp_path: Path) -> None:
    """An invalid policy set: config check prints serve's lines, one per problem."""
    policy = tmp_path / "p.yaml"
    policy.write_text(yaml.safe_dump({
        "apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
        "metadata": {"name": "p"},
        "spec": {"rules": [{"name": "r", "failurePolicy": "FailClosed",
                            "subject": {"kind": "team", "team": "t"}, "rate": {"rpm": 0}}]}}))
    check, serve = both(tmp_path, write(tmp_path, {"policies": [str(policy)]}))
    assert check.returncode == serve.returncode == 2
    assert errors(check) == errors(serve)
    assert errors(check)[0].startswith("mayu: error: policies: ")


def _shared(tmp_path: Path, **extra: Any) -> Path:
    return write(tmp_path, {"key_store": {"type": "postgres"},
                            "governance_store": {"type": "postgres"},
                            "database": {"dsn_ref": "env:IPT_DSN", "pool_min_size": 1,
                                         "pool_max_size": 2}, **extra})


def test_shared_profile_with_policy_files_fails_check_like_serve(tmp_path: Path,
                                                                 pg_dsn: str) -> None:
    """Policy files in the shared profile: both commands refuse naming ``policies``."""
    check, serve = both(tmp_path, _shared(tmp_path, policies=[str(tmp_path / "*.yaml")]),
                        IPT_DSN=pg_dsn)
    assert check.returncode == serve.returncode == 2
    assert errors(check) == errors(serve)
    assert errors(check)[0].startswith("mayu: error: policies: ")


def test_database_check_reports_an_unmigrated_database(tmp_path: Path, pg_dsn: str,
                                                       pg_empty_dsn: str) -> None:
    """``--database``: a migrated database passes; an empty one fails in one line that
    names ``mayu migrate`` (as serve does), without the DSN's password."""
    config = _shared(tmp_path)
    good = mayu(tmp_path, "config", "check", "--config", str(config), "--database",
                IPT_DSN=pg_dsn)
    assert good.returncode == 0, good.stderr
    assert "config ok" in good.stdout and "at schema" in good.stdout
    serve = mayu(tmp_path, "serve", "--config", str(config), "--port", "0",
                 IPT_DSN=pg_empty_dsn)
    check = mayu(tmp_path, "config", "check", "--config", str(config), "--database",
                 IPT_DSN=pg_empty_dsn)
    assert check.returncode == serve.returncode == 2
    assert errors(check) == errors(serve) and len(errors(serve)) == 1, serve.stderr
    assert "mayu migrate" in errors(serve)[0]
    assert "Traceback" not in serve.stdout + serve.stderr


LONG = "a-long-enough-admin-token-0123"


@pytest.mark.parametrize(("server", "key"), [
    ({"admin_token_ref": "env:IPT_SHORT"}, "server.admin_token_ref: the token must be at "
                                           "least 16 characters (it has 6)"),
    ({"admin_tokens": [{"name": "ops", "token_ref": "env:IPT_SHORT", "access": "write"}]},
     "server.admin_tokens[0].token_ref: the token must be at least 16"),
    ({"admin_tokens": [{"name": "ops", "token_ref": "env:IPT_LONG", "access": "write"},
                       {"name": "bi", "token_ref": "env:IPT_LONG"}]},
     "server.admin_tokens[1].token_ref: the same token as 'ops'"),
    ({"admin_token_ref": "env:IPT_LONG",
      "admin_tokens": [{"name": "ops", "token_ref": "env:IPT_LONG", "access": "write"}]},
     "server.admin_tokens[0].token_ref: the same token as 'admin'"),
    ({"admin_tokens": [{"name": "ops", "token_ref": "env:IPT_LONG"},
                       {"name": "ops", "token_ref": "env:IPT_OTHER"}]},
     "server.admin_tokens[1].name: 'ops' is used twice"),
    ({"rotation_secret_ref": "env:IPT_LONG"},
     "server.rotation_secret_ref: a rotation secret must be at least 32 characters"),
], ids=["legacy-short", "short", "same-value", "same-as-legacy", "same-name",
        "short-rotation-secret"])
def test_admin_tokens_are_checked_alike_by_check_and_serve(
        tmp_path: Path, server: dict[str, Any], key: str) -> None:
    """A short (< 16 characters) or repeated admin token, in either setting, and a short
    rotation secret: config check and serve both refuse with one line naming the key
    (serve with no traceback), and neither prints the value."""
    env = {"IPT_SHORT": "sixsix", "IPT_LONG": LONG, "IPT_OTHER": LONG + "-other"}
    check, serve = both(tmp_path, write(tmp_path, {"server": server}), **env)
    assert check.returncode == serve.returncode == 2, (check.stderr, serve.stderr)
    assert errors(check) == errors(serve) and len(errors(check)) == 1, (check.stderr,
                                                                        serve.stderr)
    assert key in check.stderr and "Traceback" not in serve.stderr
    assert LONG not in check.stderr + serve.stderr and "sixsix" not in check.stderr
