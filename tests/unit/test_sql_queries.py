"""The ``sql`` package: named queries load from ``queries.sql`` and use named parameters."""

from __future__ import annotations

import re

import pytest

import sql


def test_every_named_query_loads_and_is_non_empty() -> None:
    """Each `-- name:` block of queries.sql is exposed under its name, with its SQL."""
    names = re.findall(r"^--\s*name:\s*(\w+)", sql.script("queries"), re.MULTILINE)
    assert len(names) == len(set(names)) > 10
    for name in names:
        assert name in sql.queries
        assert sql.queries[name].split()  # not empty


def test_queries_only_use_named_placeholders() -> None:
    """Parameters are always %(name)s: no positional %s and no stray % in any query."""
    for name in re.findall(r"^--\s*name:\s*(\w+)", sql.script("queries"), re.MULTILINE):
        stripped = re.sub(r"%\(\w+\)s", "", sql.queries[name])
        assert "%" not in stripped, name


def test_unknown_query_is_a_key_error() -> None:
    """Asking for a query that does not exist fails loudly instead of running nothing."""
    with pytest.raises(KeyError):
        sql.queries["no_such_query"]


def test_function_scripts_are_package_data() -> None:
    """The migration scripts ship with the package and define the versioned functions."""
    assert "CREATE FUNCTION inferplane_admit_v1" in sql.script("admit_v1")
    assert "CREATE FUNCTION inferplane_settle_v1" in sql.script("settle_v1")
    assert "CREATE TABLE permits" in sql.script("schema_v1")
    assert "CREATE FUNCTION inferplane_admit_v2" in sql.script("admit_v2")
    assert "CREATE FUNCTION inferplane_settle_v2" in sql.script("settle_v2")
    assert "CREATE FUNCTION inferplane_resolve_v2" in sql.script("settle_v2")
    assert "ADD COLUMN liability" in sql.script("schema_v2")
    assert "CREATE FUNCTION inferplane_admit_v6" in sql.script("plans_v6")
    assert "CREATE FUNCTION inferplane_settle_one_v7" in sql.script("plans_v7")
    assert "inferplane_settle_one_v7(" in sql.queries["settle_one_v7"]
    assert "CREATE FUNCTION inferplane_admit_one_v7" in sql.script("plans_v7")
    assert "inferplane_admit_one_v7(" in sql.queries["admit_one_v7"]
    assert "CREATE FUNCTION inferplane_admit_v8" in sql.script("plans_v8")
    assert "inferplane_admit_v8(" in sql.queries["admit_v8"]
    assert "CREATE FUNCTION inferplane_settle_v8" in sql.script("plans_v8")
    assert "inferplane_settle_v8(" in sql.queries["settle_v8"]
