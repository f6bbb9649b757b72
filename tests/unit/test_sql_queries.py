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


def test_schema_files_are_package_data_and_every_call_is_defined() -> None:
    """The schema files ship with the package, and every function a named query calls
    is defined in them exactly once (one current definition per call)."""
    text = "\n".join(sql.script(name) for name in sql.SCHEMA)
    assert "CREATE TABLE permits" in text
    defined = re.findall(r"^CREATE FUNCTION (inferplane_\w+)", text, re.MULTILINE)
    assert len(defined) == len(set(defined))
    for name in ("queries", "lease_queries"):
        body = sql.script(name)
        for called in re.findall(r"\b(inferplane_\w+)\(", body):
            assert called in defined, called


def test_sql_decides_no_http_status() -> None:
    """Refusals leave the database as codes and figures; statuses come from the refusal
    table (gateway/governance/_refusal.py), never from SQL."""
    for name in sql.SCHEMA:
        text = sql.script(name)
        assert not re.search(r"'status',\s*\d{3}|THEN\s*(402|429|503)\b", text), name

