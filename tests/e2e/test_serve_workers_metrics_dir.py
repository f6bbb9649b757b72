"""The worker supervisor's metrics directory (``PROMETHEUS_MULTIPROC_DIR``) across a crash.

Real processes: ``mayu serve`` with two workers and the e2e mock upstream, its temporary
directory pointed at the test's own (``TMPDIR``), so the test sees exactly the
directories the supervisor makes and removes.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.e2e._procs import Proc, free_port, start, upstream_proc, wait_ready
from tests.e2e.conftest import ADMIN_TOKEN
from tests.e2e.test_serve_workers import _alive, _config, _kill_supervisor, _worker_pids

pytestmark = pytest.mark.e2e


upstream = upstream_proc  # the fixture, under this module's name


def _serve(config: Path, tmp: Path, name: str) -> Proc:
    port = free_port()
    return wait_ready(start(["serve", "--config", str(config), "--port", str(port)],
                            port=port, log_path=config.parent / f"{name}.log",
                            env={"MAYU_E2E_ADMIN_TOKEN": ADMIN_TOKEN, "TMPDIR": str(tmp)}))


def _metric_dirs(tmp: Path) -> set[str]:
    return {p.name for p in tmp.iterdir() if p.name.startswith("mayu-metrics-")}


def test_a_killed_supervisors_metrics_dir_is_removed_at_the_next_start(
        tmp_path: Path, upstream: Proc) -> None:
    """kill -9 the supervisor: its metrics directory stays behind (with the workers'
    files); the next start removes it and makes its own, which a clean stop removes."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    config = _config(tmp_path, upstream, workers=2)
    first = _serve(config, tmp, "first")
    pids: dict[int, int] = {}
    try:
        pids = _worker_pids(first, 2)
        (left,) = _metric_dirs(tmp)
        assert left.startswith(f"mayu-metrics-{first.popen.pid}-")
        _kill_supervisor(first, pids)
        assert _metric_dirs(tmp) == {left} and any((tmp / left).iterdir())
    finally:
        first.stop()
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    second = _serve(config, tmp, "second")
    try:
        _worker_pids(second, 2)
        (now,) = _metric_dirs(tmp)
        assert now != left and now.startswith(f"mayu-metrics-{second.popen.pid}-")
    finally:
        second.stop()
    assert _metric_dirs(tmp) == set()
