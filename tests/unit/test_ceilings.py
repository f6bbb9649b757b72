"""The shared numeric ceilings live in ``gateway/ceilings.py`` only, a leaf module."""

from __future__ import annotations

import ast
from pathlib import Path

from gateway import ceilings

ROOT = Path(__file__).resolve().parents[2]
NAMES = {name for name in vars(ceilings) if name.startswith("MAX_")}


def test_the_ceilings_module_imports_nothing_from_the_packages() -> None:
    tree = ast.parse((ROOT / "gateway" / "ceilings.py").read_text(encoding="utf-8"))
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert NAMES and all(not m.startswith(("gateway", "controlplane")) for m in imported)


def test_no_other_module_defines_a_ceiling() -> None:
    """A module uses a ceiling by importing it, never by repeating its value."""
    defined = []
    for package in ("gateway", "controlplane"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "gateway" / "ceilings.py":
                continue
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                targets = (node.targets if isinstance(node, ast.Assign)
                           else [node.target] if isinstance(node, ast.AnnAssign) else [])
                defined += [f"{path.relative_to(ROOT)}: {t.id}" for t in targets
                            if isinstance(t, ast.Name) and t.id in NAMES]
    assert defined == []
