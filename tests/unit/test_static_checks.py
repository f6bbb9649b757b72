"""The tree stays ``ruff`` and ``mypy --strict`` clean (both configured in pyproject.toml).

The checkers run as subprocesses of the running interpreter (``sys.executable -m``), so
they come from the same environment as the tests, with the repo root as working directory
so they pick up its configuration; CI (scripts/test) therefore fails on a new finding.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, check=False)


def test_ruff_is_clean() -> None:
    """`ruff check .` reports nothing across gateway, controlplane, sql, migrations, tests."""
    result = _run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    """`mypy gateway controlplane sql` (strict, per pyproject.toml) reports no errors."""
    result = _run("mypy", "gateway", "controlplane", "sql")
    assert result.returncode == 0, result.stdout + result.stderr
