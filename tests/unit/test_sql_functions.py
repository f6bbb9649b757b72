"""The PL/pgSQL of ``sql/`` reads at once: no function is longer than a screen or two, and
the request log is written by one statement."""

from __future__ import annotations

import re

import sql

MAX_LINES = 120


def _functions(text: str) -> dict[str, int]:
    """Each ``CREATE FUNCTION`` of ``text`` with its length in lines (through ``$$;``)."""
    found: dict[str, int] = {}
    name, start = None, 0
    for number, line in enumerate(text.splitlines()):
        if match := re.match(r"CREATE FUNCTION (\w+)\(", line):
            name, start = match.group(1), number
        elif name is not None and line.startswith("$$;"):
            found[name] = number - start + 1
            name = None
    return found


def test_no_function_is_over_120_lines() -> None:
    """Every function of the present Postgres files has at most 120 lines."""
    lengths = {name: n for file in sql.SCHEMA for name, n in _functions(sql.script(file)).items()}
    assert len(lengths) > 30
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


def test_the_request_log_is_written_once() -> None:
    """One statement of the Postgres SQL inserts into the request log (permit_facts)."""
    texts = [sql.script(name) for name in (*sql.SCHEMA, "queries")]
    assert sum(len(re.findall(r"INSERT INTO permit_facts\b", t)) for t in texts) == 1
