"""npm for the tests that install the real agents (Claude Code, Codex CLI) from the npm
registry. ``scripts/test`` installs npm with apt-get when it is absent, so a missing npm
or an unreachable registry fails these tests, saying which: they are never skipped."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def require_npm(what: str) -> str:
    """The npm executable, once the registry answered ``npm ping``; else the test fails
    naming what it could not install and why."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(f"npm is not installed (scripts/test installs it with apt-get): "
                    f"cannot install {what}")
    try:
        ping = subprocess.run([npm, "ping"], capture_output=True, text=True, timeout=30,
                              check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the npm registry did not answer `npm ping` within 30 s: cannot "
                    f"install {what}")
    if ping.returncode != 0:
        pytest.fail(f"the npm registry is unreachable (`npm ping`: "
                    f"{ping.stderr.strip()[-300:]}): cannot install {what}")
    return npm
