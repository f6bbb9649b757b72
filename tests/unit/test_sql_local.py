"""The local profile's SQLite statements: ``sql/local/<store>.sql``, and only there.

Each file opens with a comment saying what it holds, then its ``schema``, then one named
statement per call, with ``:name`` parameters; every statement compiles against the four
schemas together (one file holds them all: ``<data_dir>/mayu.db``), as written and as
:class:`gateway.localdb.Statement` numbers its parameters. No gateway module
passes a statement of its own to SQLite but the connection settings and transaction
control of :mod:`gateway.localdb`.
"""

from __future__ import annotations

import ast
import re
import sqlite3
import tomllib
from pathlib import Path

import pytest

import sql
from gateway.localdb import Statement

ROOT = Path(__file__).resolve().parents[2]
STORES = {"keys": sql.local_keys, "governance": sql.local_governance,
          "lease": sql.local_lease, "alerts": sql.local_alerts, "usage": sql.local_usage,
          "agent_usage": sql.local_agent_usage}


def _names(store: str) -> list[str]:
    return re.findall(r"^--\s*name:\s*(\w+)", sql.script(f"local/{store}"), re.MULTILINE)


def test_the_files_are_the_stores_and_package_data() -> None:
    """One file per store in sql/local/, shipped with the package."""
    assert sorted(p.stem for p in (ROOT / "sql" / "local").glob("*.sql")) == sorted(STORES)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "local/*.sql" in project["tool"]["setuptools"]["package-data"]["sql"]


@pytest.mark.parametrize("store", sorted(STORES))
def test_each_file_has_a_header_then_its_schema_then_named_statements(store: str) -> None:
    text = sql.script(f"local/{store}")
    header = text[:text.index("-- name:")].strip().splitlines()
    assert header and all(line.startswith("--") for line in header)
    names = _names(store)
    assert names[0] == "schema" and len(names) == len(set(names)) > 1
    assert "CREATE TABLE IF NOT EXISTS" in STORES[store]["schema"]
    for name in names[1:]:
        # A trigger on another store's table is created once that store's schema exists.
        if not name.startswith("trigger_"):
            assert "CREATE " not in STORES[store][name].upper(), name


@pytest.mark.parametrize("store", sorted(STORES))
def test_parameters_are_named(store: str) -> None:
    """``:name`` parameters only: no positional ``?`` and no psycopg ``%(name)s``
    (outside string literals and comments: ``strftime('%Y-%m-%d', …)`` is SQL)."""
    for name in _names(store):
        body = re.sub(r"--[^\n]*", "", re.sub(r"'[^']*'", "''", STORES[store][name]))
        assert "?" not in body and "%" not in body, name


def test_every_statement_compiles_against_the_four_schemas() -> None:
    """As written (bound by name) and as the stores run it (numbered, from a tuple)."""
    conn = sqlite3.connect(":memory:")
    for queries in STORES.values():
        conn.executescript(queries["schema"])
    for store, queries in STORES.items():
        for name in _names(store)[1:]:
            body = queries[name]
            statement = Statement(f"EXPLAIN {body}")
            params = dict.fromkeys(statement.names)
            conn.execute(f"EXPLAIN {body}", params)  # compiles; runs nothing
            statement.execute(conn, params)
            assert re.sub(r"\?\d+", "", statement.text).count("?") == 0


def test_a_statement_numbers_its_names_and_binds_them_from_a_mapping() -> None:
    """Each name is ?N by first appearance (a repeated one keeps its number); string
    literals, quoted identifiers and comments are left alone; a missing value fails."""
    statement = Statement("-- where :x is not a parameter\n"
                          "SELECT :b AS \"a:c\", ':d', :a, :b || '::e'")
    assert statement.names == ("b", "a")
    assert statement.text == ("-- where :x is not a parameter\n"
                              "SELECT ?1 AS \"a:c\", ':d', ?2, ?1 || '::e'")
    conn = sqlite3.connect(":memory:")
    row = statement.execute(conn, {"a": 1, "b": "B", "unused": 0}).fetchone()
    assert row == ("B", ":d", 1, "B::e")
    with pytest.raises(KeyError, match="a"):
        statement.execute(conn, {"b": "B"})
    conn.execute("CREATE TABLE t (k TEXT, v INTEGER)")
    Statement("INSERT INTO t VALUES (:k, :v)").executemany(
        conn, [{"k": "one", "v": 1}, {"v": 2, "k": "two"}])
    assert conn.execute("SELECT * FROM t ORDER BY v").fetchall() == [("one", 1), ("two", 2)]
    assert Statement("SELECT :only").execute(conn, {"only": 7}).fetchone() == (7,)
    assert Statement("SELECT 1").execute(conn).fetchone() == (1,)


def test_values_in_the_order_the_caller_expects() -> None:
    """The request path passes values in order: checked once against the names."""
    statement = Statement("SELECT :b, :a, :b").expect("b", "a")
    conn = sqlite3.connect(":memory:")
    assert statement.execute_values(conn, "B", "A").fetchone() == ("B", "A", "B")
    conn.execute("CREATE TABLE t (k TEXT, v INTEGER)")
    Statement("INSERT INTO t VALUES (:k, :v)").expect("k", "v").executemany_values(
        conn, [("one", 1), ("two", 2)])
    assert conn.execute("SELECT * FROM t ORDER BY v").fetchall() == [("one", 1), ("two", 2)]
    with pytest.raises(ValueError, match=r"parameters are \('b', 'a'\), not \('a', 'b'\)"):
        statement.expect("a", "b")


def _statements(path: Path) -> list[tuple[int, str]]:
    """The string literals a module passes to execute/executemany/executescript."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("execute", "executemany", "executescript")
                and node.args and isinstance(node.args[0], ast.Constant | ast.JoinedStr)):
            found.append((node.lineno, ast.unparse(node.args[0])))
    return found


def test_no_gateway_module_holds_a_sqlite_statement() -> None:
    """Every SQLite statement is a named one from sql/local/, except the connection
    settings, transaction control and the schema check of gateway/localdb.py."""
    control = re.compile(r"^f?['\"](PRAGMA |BEGIN|COMMIT|ROLLBACK|SELECT name FROM "
                         r"(pragma_table_info|sqlite_master))")
    inline = []
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        if "import sqlite3" not in path.read_text(encoding="utf-8"):
            continue
        for line, text in _statements(path):
            if not (path.name == "localdb.py" and control.match(text)):
                inline.append(f"{path.relative_to(ROOT)}:{line}: {text[:60]}")
    assert inline == []
