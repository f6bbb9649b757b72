"""The console ships in the wheel: its templates and vendored static assets are package
data, so an installed gateway (the image) serves it with no checkout and no network."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.e2e._procs import ROOT
from tests.e2e._wheelhouse import build_inferplane_wheel

pytestmark = pytest.mark.e2e


def test_the_wheel_carries_every_console_template_and_asset(tmp_path: Path) -> None:
    """Every file under gateway/console/templates and static is in the built wheel."""
    wheel = build_inferplane_wheel(ROOT, tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    console = ROOT / "gateway" / "console"
    wanted = {p.relative_to(ROOT).as_posix() for sub in ("templates", "static")
              for p in (console / sub).iterdir() if p.is_file()}
    assert {"gateway/console/static/htmx.min.js",
            "gateway/console/templates/base.html"} <= wanted
    assert wanted - names == set()
