"""The Dockerfile builds what the wheel ships, as non-root, for a read-only root.

No container engine runs here (docs/deploy.md), so the image itself is exercised by
tests/e2e/test_wheel_install.py (the same wheel in a clean venv, as nobody); these checks
keep the Dockerfile and .dockerignore in step with the packages pyproject.toml ships.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _packages() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]]


def test_every_shipped_package_reaches_the_build() -> None:
    """Each top-level package pyproject ships is copied into the build stage and not
    excluded by .dockerignore (a missing one would build a wheel without it)."""
    ignore = (ROOT / ".dockerignore").read_text()
    for package in _packages():
        assert re.search(rf"^COPY {package} {package}$", DOCKERFILE, re.M), package
        assert f"!{package}/" in ignore, package


def test_runs_unprivileged_with_only_volumes_writable() -> None:
    """A numeric non-root USER, bytecode compiled at build time, and the data dir and
    /tmp as volumes: nothing else needs to be writable."""
    user = re.findall(r"^USER (\S+)", DOCKERFILE, re.M)
    assert user and not user[-1].startswith(("0", "root"))
    assert "PYTHONDONTWRITEBYTECODE=1" in DOCKERFILE and "--compile" in DOCKERFILE
    assert 'VOLUME ["/var/lib/mayu", "/tmp"]' in DOCKERFILE
    assert "--no-index --find-links /wheels" in DOCKERFILE


def test_scripts_image_explains_when_no_builder_runs() -> None:
    """scripts/image exits 3 with a reason per builder when none can build here, and
    0 naming the builder otherwise (its --check mode builds nothing)."""
    done = subprocess.run([str(ROOT / "scripts" / "image"), "--check"], capture_output=True,
                          text=True, timeout=60, check=False)
    if done.returncode == 0:
        assert "would build" in done.stdout
    else:
        assert done.returncode == 3, done.stderr
        assert "no container builder can run on this machine" in done.stderr
