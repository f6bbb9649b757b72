"""``./scripts/serve`` and the package metadata it installs from.

The script is run as written from a copy of the checkout whose ``.venv`` is a stand-in
(its ``python`` records each pip call and runs anything else with this interpreter; its
``mayu`` records the call): it installs only when ``pyproject.toml`` changed or
``mayu`` is missing, with the ``sdk`` extra the README's snippets import, and always
ends in ``mayu serve`` with its arguments. The metadata setuptools builds from
``pyproject.toml`` carries the SPDX licence and its file, without a deprecation warning.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e._procs import ROOT
from tests.e2e._wheelhouse import SOURCES

pytestmark = pytest.mark.e2e

PYTHON_STUB = """#!/usr/bin/env bash
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "pip ${*:3}" >> "$CALLS"; exit 0; fi
exec "$REAL_PYTHON" "$@"
"""
MAYU_STUB = """#!/usr/bin/env bash
echo "mayu $*" >> "$CALLS"
"""


def _checkout(tmp_path: Path) -> Path:
    """A copy of the files the script reads, with a stand-in .venv."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "serve", root / "scripts" / "serve")
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("python", PYTHON_STUB), ("mayu", MAYU_STUB)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return root


def _serve(root: Path, *args: str) -> list[str]:
    """Run ./scripts/serve once; the calls it made to pip and mayu."""
    calls = root / "calls.log"
    calls.unlink(missing_ok=True)
    done = subprocess.run(["./scripts/serve", *args], cwd=root, capture_output=True,
                          text=True, timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", "CALLS": str(calls),
                               "REAL_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr
    return calls.read_text().splitlines()


def test_serve_installs_only_when_pyproject_changed(tmp_path: Path) -> None:
    """First run installs the sdk extra then serves; a second run only serves; an edited
    pyproject.toml, or a .venv without mayu, installs again."""
    root = _checkout(tmp_path)
    install = ["pip install -q --upgrade pip", "pip install -q -e .[sdk]"]
    assert _serve(root) == [*install, "mayu serve"]
    assert _serve(root, "--port", "4001") == ["mayu serve --port 4001"]
    with (root / "pyproject.toml").open("a") as f:
        f.write("\n# edited\n")
    assert _serve(root) == [*install, "mayu serve"]
    assert _serve(root) == ["mayu serve"]
    mayu = root / ".venv" / "bin" / "mayu"
    text = mayu.read_text()
    mayu.unlink()
    calls = root / "calls.log"
    done = subprocess.run(["./scripts/serve"], cwd=root, capture_output=True, text=True,
                          timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", "CALLS": str(calls),
                               "REAL_PYTHON": sys.executable})
    assert calls.read_text().splitlines()[-2:] == install, done.stderr
    mayu.write_text(text)


def test_package_metadata_has_the_spdx_licence_and_no_deprecation(tmp_path: Path) -> None:
    """setuptools builds the metadata with ``License-Expression: Apache-2.0`` and the
    LICENSE file, and prints no deprecation warning (the table form printed two); the
    image's and the wheel test's build copies include LICENSE (else setuptools warns
    that ``license-files`` matched nothing)."""
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, tmp_path / name)
    (tmp_path / "out").mkdir()
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c",
         "import setuptools.build_meta as b; print(b.prepare_metadata_for_build_wheel('out'))"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "deprecat" not in (done.stdout + done.stderr).lower(), done.stderr
    info = tmp_path / "out" / done.stdout.strip().splitlines()[-1] / "METADATA"
    metadata = info.read_text().splitlines()
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
    # The image and the wheel test build from copies: each takes the licence file too.
    assert "!LICENSE" in (ROOT / ".dockerignore").read_text().splitlines()
    assert "COPY pyproject.toml README.md LICENSE ./" in (ROOT / "Dockerfile").read_text()
    assert "LICENSE" in SOURCES
