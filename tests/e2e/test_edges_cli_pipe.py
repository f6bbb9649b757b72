"""``mayu`` commands whose stdout is closed early stop quietly (issue 25).

Real ``mayu`` processes whose stdout is a pipe nobody reads any more (as after ``| head
-3``): the read end is closed before the command writes, so its first write fails with
EPIPE every time. Each must exit 141 (128 + SIGPIPE, what a shell reports for ``git log
| head``) with nothing on stderr — no ``BrokenPipeError`` traceback, no "Exception
ignored" line at interpreter exit.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e._procs import _env, mayu_cmd

pytestmark = pytest.mark.e2e

POLICY = {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
          "metadata": {"name": "p"},
          "spec": {"rules": [{"name": "rate", "subject": {"kind": "team", "team": "t"},
                              "failurePolicy": "FailOpen", "rate": {"rpm": 10}}]}}


def _closed_stdout(cwd: Path, *args: str) -> tuple[int, str]:
    """Run ``mayu args`` with a stdout pipe whose read end is already closed."""
    proc = subprocess.Popen(mayu_cmd(*args), cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode(errors="replace")
    return proc.wait(timeout=120), err


def test_every_kind_of_command_exits_quietly_on_a_closed_stdout(tmp_path: Path) -> None:
    """keys list (the issue's), teams list, keys create, models catalog, policy validate
    and config check: exit 141, empty stderr (--help: empty stderr); the store work before
    the write is done (the key created before its line could be printed exists)."""
    ok = subprocess.run(mayu_cmd("teams", "create", "t"), cwd=tmp_path, env=_env(),
                        capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    for _ in range(3):
        subprocess.run(mayu_cmd("keys", "create", "--team", "t"), cwd=tmp_path, env=_env(),
                       capture_output=True, timeout=120, check=True)
    policy = tmp_path / "p.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    for args in (["keys", "list"], ["teams", "list", "--json"],
                 ["keys", "create", "--team", "t", "--json"], ["models", "catalog"],
                 ["policy", "validate", str(policy)], ["config", "check"]):
        code, err = _closed_stdout(tmp_path, *args)
        assert (code, err) == (141, ""), (args, code, err)
    # argparse writes --help itself and ignores a failed write: quiet, its own status.
    assert _closed_stdout(tmp_path, "keys", "--help")[1] == ""
    listed = subprocess.run(mayu_cmd("keys", "list", "--json"), cwd=tmp_path, env=_env(),
                            capture_output=True, text=True, timeout=120, check=True)
    assert len(json.loads(listed.stdout)) == 4
