"""The wheel is the image: installed into a clean venv it migrates and serves, as non-root.

What the image does (``Dockerfile``: ``pip install`` of the built wheel, then ``mayu
migrate`` and ``mayu serve`` as an unprivileged user), without a container engine: the
project's wheel is built from a copy of the checkout, its dependencies come from an
offline wheelhouse packed from the test environment (``tests/e2e/_wheelhouse.py``), and
the venv has no access to the checkout or the test environment's site-packages. Then,
as ``nobody`` (when the suite runs as root): ``mayu migrate`` on an empty database,
``mayu teams``/``keys create``, ``mayu serve`` in the shared profile, one real request.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.schema import code_heads
from tests.e2e._procs import ROOT, free_port
from tests.e2e._wheelhouse import build_inferplane_wheel, wheelhouse_from_environment

pytestmark = pytest.mark.e2e

USER = "nobody"


def _as_user() -> list[str]:
    """The prefix that runs a command unprivileged (empty when not root)."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        pytest.fail(f"running as root and there is no {USER!r} user to run the image as "
                    "(the image runs unprivileged; this machine kind has one)")
    if runuser is None:
        pytest.fail("running as root and runuser is not installed (util-linux)")
    return [runuser, "-u", USER, "--"]


def _interpreter(prefix: list[str]) -> str:
    """A Python of the suite's version that the unprivileged user can run (the suite's
    own may live under a private home directory, as pyenv's does under /root)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [getattr(sys, "_base_executable", sys.executable),
                  f"/usr/local/bin/python{version}", f"/usr/bin/python{version}"]
    for python in candidates:
        if not os.path.exists(python):
            continue
        probe = subprocess.run([*prefix, python, "-c", "import venv, ensurepip"],
                               capture_output=True, timeout=30, check=False)
        if probe.returncode == 0:
            return python
    pytest.fail(f"no Python {version} with venv that {USER!r} can run "
                f"(tried {', '.join(candidates)})")


@pytest.fixture(scope="module")
def venv() -> Iterator[Path]:
    """A fresh venv with the built wheel installed offline; world-readable, so the
    unprivileged user can run it."""
    work = Path(tempfile.mkdtemp(prefix="inferplane-wheel-"))
    try:
        work.chmod(0o755)
        wheel = build_inferplane_wheel(ROOT, work / "build")
        house = work / "wheelhouse"
        wheelhouse_from_environment(house)
        env_dir = work / "venv"
        subprocess.run([_interpreter(_as_user()), "-m", "venv", str(env_dir)], check=True,
                       timeout=120)
        subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                        "--no-index", "--find-links", str(house), str(wheel)],
                       check=True, timeout=180, env=_clean_env())
        for path in [work, *work.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        yield env_dir
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _clean_env(**extra: str) -> dict[str, str]:
    """No PYTHONPATH, no venv of the suite: only what the image would have."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    env.update(extra)
    return env


def _run(prefix: list[str], venv: Path, *args: str, cwd: Path,
         **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, str(venv / "bin" / "mayu"), *args], cwd=cwd,
                          env=_clean_env(**env), capture_output=True, text=True,
                          timeout=120, check=False)


def test_installed_wheel_imports_from_its_own_venv(venv: Path) -> None:
    """gateway, controlplane, sql and migrations all come from the installed wheel."""
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import gateway, controlplane, sql, migrations, gateway.schema as s;"
         "print(gateway.__file__, migrations.__file__, s.script_location())"],
        cwd="/", env=_clean_env(), capture_output=True, text=True, check=True)
    for path in done.stdout.split():
        assert path.startswith(str(venv)), done.stdout
    assert (venv / "bin" / "inferplaned").exists()


def test_installed_wheel_migrates_and_serves_as_non_root(venv: Path, tmp_path: Path,
                                                         pg_empty_dsn: str) -> None:
    """As an unprivileged user: mayu migrate (one line per revision) brings an empty
    database to head, and mayu serve answers a real request in the shared profile."""
    prefix = _as_user()
    work = Path(tempfile.mkdtemp(prefix="inferplane-run-"))
    try:
        work.chmod(0o777)  # the unprivileged user's data dir and tmp
        env = {"INFERPLANE_DATABASE_URL": pg_empty_dsn, "TMPDIR": str(work),
               "HOME": str(work)}
        migrated = _run(prefix, venv, "migrate", cwd=work, **env)
        assert migrated.returncode == 0, migrated.stderr
        lines = migrated.stdout.splitlines()
        assert any("applied base -> v010_baseline" in line for line in lines), migrated.stdout
        assert lines[-1].endswith(f"now at {', '.join(code_heads())}"), migrated.stdout
        assert "postgres@" not in migrated.stdout  # where, never the credentials

        config = work / "mayu.yaml"
        config.write_text(yaml.safe_dump({
            "data_dir": str(work / "data"), "demo": False,
            "key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
            "database": {"dsn_ref": "env:INFERPLANE_DATABASE_URL", "pool_min_size": 1,
                         "pool_max_size": 2},
            "server": {"replica_id": "wheel"},
            "providers": [{"name": "local", "kind": "mock"}],
            "models": [{"name": "m", "deployments": [{"provider": "local"}]}]}))
        config.chmod(0o644)
        team = _run(prefix, venv, "teams", "create", "t", "--config", str(config), cwd=work,
                    **env)
        assert team.returncode == 0, team.stderr
        made = _run(prefix, venv, "keys", "create", "--team", "t", "--json", "--config",
                    str(config), cwd=work, **env)
        assert made.returncode == 0, made.stderr
        key = json.loads(made.stdout)["key"]

        port = free_port()
        log = (work / "serve.log").open("wb")
        proc = subprocess.Popen([*prefix, str(venv / "bin" / "mayu"), "serve", "--config",
                                 str(config), "--port", str(port), "--log-level", "warning"],
                                cwd=work, env=_clean_env(**env), stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, (work / "serve.log").read_text()
                assert time.monotonic() < deadline, (work / "serve.log").read_text()
                try:
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            r = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                           headers={"Authorization": f"Bearer {key}"},
                           json={"model": "m", "max_tokens": 16,
                                 "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
            assert int(r.headers["x-inferplane-cost-micro-usd"]) >= 0
            audit = list((work / "data").glob("audit-*.jsonl"))
            assert audit and audit[0].stat().st_uid == (os.geteuid() if not prefix
                                                       else pwd.getpwnam(USER).pw_uid)
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
