"""Offline wheels for the clean-venv install test: inferplane's own, and its dependencies.

- :func:`build_inferplane_wheel` builds the project's wheel from a copy of the sources
  (never writing ``build/`` into the shared checkout) with ``--no-build-isolation``, so
  it needs no index: the test extra installs setuptools and wheel.
- :func:`wheelhouse_from_environment` packs every *runtime* dependency of inferplane that
  is installed in the running environment back into a wheel (its files as listed in its
  ``RECORD``, its own ``WHEEL`` tags), so ``pip install --no-index --find-links`` in a
  fresh venv gets exactly the versions the suite tested, with no network. inferplane
  itself is never taken from here: it comes from the freshly built wheel.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

SOURCES = ("pyproject.toml", "README.md", "LICENSE", "gateway", "controlplane", "sql", "migrations")


def build_inferplane_wheel(root: Path, out: Path) -> Path:
    """The wheel of the checkout at ``root`` (built in a copy), written into ``out``."""
    src = out / "src"
    for name in SOURCES:
        path = root / name
        if path.is_dir():
            shutil.copytree(path, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name)
    dist = out / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(dist), str(src)], check=True, timeout=120)
    (wheel,) = dist.glob("inferplane-*.whl")
    return wheel


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure(project: str = "inferplane") -> list[md.Distribution]:
    """Installed distributions ``project`` needs at run time (no extras), transitively."""
    seen: dict[str, md.Distribution] = {}
    done: set[tuple[str, str]] = set()
    todo: list[tuple[str, str]] = [(_norm(project), "")]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in done:
            continue
        done.add((name, extra))
        dist = seen.setdefault(name, md.distribution(name))
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            if req.marker is None and extra:
                continue  # already taken with the base requirements
            todo += [(_norm(req.name), e) for e in ("", *sorted(req.extras))]
    return [d for n, d in seen.items() if n != _norm(project)]


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def repack(dist: md.Distribution, out: Path) -> Path:
    """One installed distribution as a wheel file in ``out``."""
    wheel_meta = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel_meta.splitlines()
            if line.startswith("Tag:")]
    name = re.sub(r"[-.]+", "_", dist.metadata["Name"])
    version = dist.version
    tag = tags[0] if tags else "py3-none-any"
    if len(tags) > 1:  # compressed tag set: py2.py3-none-any and the like
        parts = [t.split("-") for t in tags]
        tag = "-".join(".".join(dict.fromkeys(p[i] for p in parts)) for i in range(3))
    path = out / f"{name}-{version}-{tag}.whl"
    info = f"{name}-{version}.dist-info"
    record: list[str] = []
    base = Path(str(dist.locate_file("")))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for file in dist.files or []:
            posix = file.as_posix()
            if posix.startswith("..") or "__pycache__" in posix or posix.endswith("RECORD"):
                continue  # console scripts (pip writes them again), bytecode, the record
            source = base / file
            if not source.is_file():
                continue
            arcname = posix
            if ".dist-info/" in posix:
                arcname = f"{info}/{posix.split('.dist-info/', 1)[1]}"
            if arcname.endswith(("/INSTALLER", "/REQUESTED", "/direct_url.json")):
                continue
            data = source.read_bytes()
            zf.writestr(arcname, data)
            record.append(_record_line(arcname, data))
        record.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def wheelhouse_from_environment(out: Path) -> list[Path]:
    """Every runtime dependency of inferplane, as wheels in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    return [repack(d, out) for d in runtime_closure()]
