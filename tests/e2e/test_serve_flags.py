"""``mayu serve``'s startup as a newcomer and an operator meet it, as real processes.

A busy port is one line and a non-zero exit before anything is made (no demo key, no
"mayu ready", no data dir); a second gateway on a data dir in use is the one line naming
it, without the lifespan's traceback; ``--data-dir`` and ``--replica-id`` let a second
gateway on the same host run from the same config; the data dir the CLI creates is its
owner's only (0700), whichever command creates it.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e._procs import ROOT, Proc, _env, free_port, mayu_cmd, start, wait_ready

pytestmark = pytest.mark.e2e

SHARED = ROOT / "examples" / "shared.yaml"


def _run(cwd: Path, *args: str, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(mayu_cmd(*args), cwd=cwd, capture_output=True, text=True,
                          env=_env(env), timeout=90, check=False)


@contextmanager
def _serving(cwd: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Proc]:
    port = free_port()
    proc = start(["serve", "--port", str(port), *args], port=port,
                 log_path=cwd / f"serve-{port}.log", env=env)
    try:
        yield wait_ready(proc)
    finally:
        proc.stop()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_busy_port_is_one_line_before_anything_is_made(tmp_path: Path) -> None:
    """A port another process listens on: exit 2 with one line naming the port and
    --port; no "mayu ready", no demo key, no data dir."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _run(tmp_path, "serve", "--port", str(port))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        f"mayu: error: server.port: cannot listen on 127.0.0.1:{port}: Address already in "
        "use (the port is busy: stop what listens there, or choose --port)"]
    assert "ready" not in done.stdout and "sk-inf-" not in done.stdout
    assert not (tmp_path / ".mayu").exists()


def test_a_second_gateway_on_a_data_dir_in_use_is_one_line(tmp_path: Path) -> None:
    """A second ``mayu serve`` on the first one's data dir exits non-zero with the one
    line naming the journal in use and no traceback; with its own --data-dir it serves,
    and that folder is 0700."""
    with _serving(tmp_path):
        done = _run(tmp_path, "serve", "--port", str(free_port()))
        out = done.stdout + done.stderr
        assert done.returncode != 0, out
        assert "Traceback" not in out and "  File " not in out
        [line] = [line for line in out.splitlines() if "ERROR" in line and "mayu" in line]
        assert "is in use by another process" in line and "--data-dir" in line
        with _serving(tmp_path, "--data-dir", "second") as other:
            assert "mayu ready" in other.logs()
            assert (tmp_path / "second" / "mayu.db").exists()
            assert _mode(tmp_path / "second") == 0o700
    assert _mode(tmp_path / ".mayu") == 0o700


def test_two_shared_replicas_run_from_one_config_with_replica_id(tmp_path: Path,
                                                                 pg_dsn: str) -> None:
    """examples/shared.yaml as is: two gateways on one host with --replica-id a and b
    both serve, each with its own journal and audit file; a third with neither flag
    (the host name as replica id, taken by none) starts too, and one repeating "a" is
    refused with one line."""
    env = {"INFERPLANE_DATABASE_URL": pg_dsn, "INFERPLANE_ADMIN_TOKEN": "t" * 32}
    config = ("--config", str(SHARED))
    with _serving(tmp_path, *config, "--replica-id", "a", env=env), \
            _serving(tmp_path, *config, "--replica-id", "b", env=env):
        data = tmp_path / ".mayu-shared"
        assert {p.name for p in data.glob("journal-*.jsonl")} == {"journal-a.jsonl",
                                                                  "journal-b.jsonl"}
        assert _mode(data) == 0o700
        again = _run(tmp_path, "serve", *config, "--port", str(free_port()),
                     "--replica-id", "a", env=env)
        out = again.stdout + again.stderr
        assert again.returncode != 0 and "Traceback" not in out, out
        assert "journal-a.jsonl is in use by another process" in out


@pytest.mark.parametrize("bad", ["../x", "-a", "a/b", ""])
def test_a_replica_id_that_cannot_name_a_file_is_a_usage_error(tmp_path: Path,
                                                                bad: str) -> None:
    """--replica-id names files: a path or an empty id is one usage line, exit 2."""
    done = _run(tmp_path, "serve", "--replica-id", bad, "--port", "0")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "--replica-id" in done.stderr and not (tmp_path / ".mayu").exists()


def test_every_command_creates_the_data_dir_owner_only(tmp_path: Path) -> None:
    """``mayu teams create`` and ``mayu keys create`` on a fresh folder: the data dir
    they create is 0700 and its files 0600."""
    assert _run(tmp_path, "teams", "create", "t1").returncode == 0
    assert _mode(tmp_path / ".mayu") == 0o700
    other = tmp_path / "other"
    other.mkdir()
    done = _run(other, "keys", "create", "--team", "demo")
    assert _mode(other / ".mayu") == 0o700, done.stderr
    assert {_mode(p) for p in (tmp_path / ".mayu").iterdir()} == {0o600}
    assert os.listdir(tmp_path / ".mayu")
