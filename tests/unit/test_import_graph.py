"""The top-level modules and subpackages of ``gateway`` and ``controlplane`` import each
other without a circle, and only through each other's public faces.

The graph is read from the source with :mod:`ast`, without importing anything: one node
per top-level module or subpackage (``gateway.metrics``, ``gateway.alerts``,
``gateway.governance``, ``controlplane.leases``; a package's own ``__init__`` is the
node ``gateway`` or ``controlplane``), one edge per import that runs when a module is
imported: statements at module level, also inside ``if``/``try``/``with`` blocks and
class bodies, but not inside functions (they run later) nor under
``if TYPE_CHECKING:`` (they never run). ``import a.b``, ``from a import b`` (``a.b``
when that is a module, else ``a``) and relative imports (``from . import x``,
``from ..y import z``) are all resolved. Imports within one node are not edges.

A package's underscore modules (``gateway.keys._sqlite``) and underscore names are its
own: any other package imports what the package's ``__init__`` exports (``__all__``).
That rule holds for every import statement, also those in functions or under
``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "controlplane")

Graph = dict[str, dict[str, list[str]]]
"""node -> imported node -> where (``module:line``) each such import is."""


def _modules(root: Path, packages: tuple[str, ...]) -> dict[str, tuple[Path, bool]]:
    """Every module of ``packages`` under ``root``: dotted name -> (file, is a package)."""
    found: dict[str, tuple[Path, bool]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = (path, is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _blocks(node: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement blocks nested in a compound statement (class bodies included)."""
    for field in ("body", "orelse", "finalbody"):
        block = getattr(node, field, None)
        if isinstance(block, list):
            yield block
    for handler in getattr(node, "handlers", []):
        yield handler.body
    for case in getattr(node, "cases", []):
        yield case.body


def _runtime_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of ``body`` that run when the module is imported."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _runtime_imports(node.orelse)
        else:
            for block in _blocks(node):
                yield from _runtime_imports(block)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
             modules: dict[str, tuple[Path, bool]]) -> list[str]:
    """The modules an import statement imports (dotted names, resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    return [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
            for alias in node.names]


def node_of(module: str) -> str:
    """The graph node of a module: its top-level module or subpackage."""
    return ".".join(module.split(".")[:2])


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> Graph:
    modules = _modules(root, packages)
    graph: Graph = {node_of(m): {} for m in modules}
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _runtime_imports(tree.body):
            for target in _targets(node, module, is_package, modules):
                if target.split(".")[0] not in packages:
                    continue
                a, b = node_of(module), node_of(target)
                where = f"{module}:{node.lineno}"
                if a != b and where not in graph[a].setdefault(b, []):
                    graph[a][b].append(where)
    return graph


def _private_part(target: str, name: str | None) -> str | None:
    """The owner package of the private module (or name) ``target`` (``name``) imports,
    or None when both are public. A dunder (``__version__``) is public."""
    parts = target.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    if name is not None and name.startswith("_") and not name.startswith("__"):
        return target
    return None


def private_imports(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Every import of another package's underscore module or name, as
    ``importer:line -> target`` (anywhere in a module: functions too)."""
    modules = _modules(root, packages)
    found: list[tuple[str, int, str]] = []
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for alias, target in zip(node.names, _targets(node, module, is_package, modules),
                                     strict=True):
                if target.split(".")[0] not in packages:
                    continue
                name = (None if isinstance(node, ast.Import) or target.endswith(
                    "." + alias.name) else alias.name)
                owner = _private_part(target, name)
                if owner is None or module == owner or module.startswith(owner + "."):
                    continue
                shown = target if _private_part(target, None) else f"{target}.{name}"
                found.append((module, node.lineno, shown))
    return [f"{m}:{line} -> {shown}" for m, line, shown in sorted(found)]


def find_cycle(graph: Graph) -> list[str] | None:
    """One circle of ``graph`` as its nodes (the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node):], node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph.get(node, {})):
            cycle = visit(target)
            if cycle is not None:
                return cycle
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start)
        if cycle is not None:
            return cycle
    return None


def _describe(graph: Graph, cycle: list[str]) -> str:
    steps = [f"{a} -> {b} ({', '.join(graph[a][b])})" for a, b in zip(cycle, cycle[1:],
                                                                       strict=False)]
    return "import circle:\n  " + "\n  ".join(steps)


def test_gateway_and_controlplane_import_without_a_circle() -> None:
    graph = import_graph()
    assert "gateway.metrics" in graph and "controlplane.leases" in graph
    cycle = find_cycle(graph)
    assert cycle is None, _describe(graph, cycle)


def test_no_package_imports_another_packages_private_module() -> None:
    """The admin API, the console, the CLI and every other package reach another package
    only through its ``__init__`` (0 imports of another's ``_x`` module or ``_name``)."""
    assert private_imports() == []


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_circle_through_relative_and_submodule_imports_is_found(tmp_path: Path) -> None:
    """The metrics -> cluster_metrics -> alerts -> metrics shape: found when alerts'
    import of metrics runs (relative ``from .. import metrics``), not when it sits under
    ``if TYPE_CHECKING:`` or in a function."""
    files = {
        "pkg/__init__.py": "",
        "pkg/metrics.py": "from pkg.cluster_metrics import View\n",
        "pkg/cluster_metrics.py": "from pkg import alerts\n",
        "pkg/alerts/__init__.py": "from ._alerts import Alerts\n",
        "pkg/alerts/_alerts.py": ("from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from .. import metrics\n"
                                  "def later():\n    import pkg.metrics\n"),
    }
    _write(tmp_path, files)
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.cluster_metrics"] == {"pkg.alerts": ["pkg.cluster_metrics:1"]}
    assert find_cycle(graph) is None

    _write(tmp_path, {"pkg/alerts/_alerts.py": "try:\n    from .. import metrics\n"
                                               "except ImportError:\n    pass\n"})
    graph = import_graph(tmp_path, ("pkg",))
    assert find_cycle(import_graph(tmp_path, ("pkg",))) == [
        "pkg.alerts", "pkg.metrics", "pkg.cluster_metrics", "pkg.alerts"]
    assert "pkg.alerts._alerts:2" in _describe(graph, find_cycle(graph) or [])


def test_an_import_of_another_packages_private_module_is_found(tmp_path: Path) -> None:
    """``from pkg.keys._sqlite import X`` in ``pkg.admin`` (at module level, in a function,
    relative, or a private name through the public face) is found; the package's own
    imports of its private modules and a dunder are not."""
    _write(tmp_path, {
        "pkg/__init__.py": "__version__ = '1'\n",
        "pkg/keys/__init__.py": "from ._sqlite import Store\nfrom pkg.keys._model import M\n",
        "pkg/keys/_sqlite.py": "Store = 1\n",
        "pkg/keys/_model.py": "M = 1\n_hidden = 2\n",
        "pkg/admin/__init__.py": "from pkg import __version__\nfrom pkg.keys import Store\n",
        "pkg/admin/_routes.py": ("from pkg.keys._sqlite import Store\n"
                                 "def later():\n    from ..keys import _model\n"
                                 "from pkg.keys._model import _hidden\n"
                                 "import pkg.keys._model\n"
                                 "from pkg.keys import _secret\n"),
    })
    assert private_imports(tmp_path, ("pkg",)) == [
        "pkg.admin._routes:1 -> pkg.keys._sqlite",
        "pkg.admin._routes:3 -> pkg.keys._model",
        "pkg.admin._routes:4 -> pkg.keys._model",
        "pkg.admin._routes:5 -> pkg.keys._model",
        "pkg.admin._routes:6 -> pkg.keys._secret",
    ]
