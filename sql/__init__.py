"""The SQL that does the governance work, as reviewed ``.sql`` files (procrastinate style).

Postgres:
- ``schema.sql`` (every table and index), ``governance.sql`` (admission and settlement
  functions) and ``lease.sql`` (the lease ledger's functions): the present, installed in
  this order (:data:`BASELINE`) by the baseline revision and by the pre-release
  conversion; ``drop_functions.sql`` drops every ``inferplane_*`` function.
- ``queries.sql``: named queries, each introduced by a ``-- name: <name>`` line and
  exposed through :data:`queries` (``%(param)s`` placeholders only); ``lease_queries.sql``
  likewise through :data:`lease_queries` (the control plane's lease ledger calls) and
  ``alert_queries.sql`` through :data:`alert_queries` (budget alerts and the cluster
  gauges).

SQLite: ``local_alert_queries.sql`` (``:name`` parameters) through
:data:`local_alert_queries`.

Files are read once with :mod:`importlib.resources`, so they ship as package data. After
a release, a changed function is a new ``_vN+1`` created by a migration (CONTRIBUTING.md).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any, LiteralString, cast

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def script(name: str) -> LiteralString:
    """The text of ``sql/<name>.sql`` (a migration script or function definition)."""
    text = resources.files(__package__).joinpath(f"{name}.sql").read_text(encoding="utf-8")
    # The file is reviewed SQL shipped with the package, so it is vouched for as a literal
    # (PEP 675) for psycopg's typed execute(). mypy treats LiteralString as plain str and
    # calls the cast redundant; checkers that enforce PEP 675 (pyright) need it.
    return cast(LiteralString, text)  # type: ignore[redundant-cast]


BASELINE = ("schema", "governance", "lease")
"""The files that build the whole Postgres schema, in order."""


def run_script(op: Any, name: str) -> None:
    """Run ``sql/<name>.sql`` from an alembic migration (``op`` is ``alembic.op``).

    Whole files (several statements, PL/pgSQL bodies with ':=' and '%') go straight to
    the driver: SQLAlchemy's text() would parse ':name' as bind parameters."""
    text = script(name)
    if op.get_context().as_sql:
        op.execute(text)
        return
    op.get_bind().exec_driver_sql(text)


def _parse(text: str) -> dict[str, LiteralString]:
    parts = _NAME.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    named = zip(parts[1::2], parts[2::2], strict=True)
    return {name: cast(LiteralString, body.strip()) for name, body in named}


@cache
def _named(file: str) -> dict[str, LiteralString]:
    return _parse(script(file))


class _Queries:
    """``queries["name"]``: a named query from ``<file>.sql`` (KeyError if unknown)."""

    def __init__(self, file: str = "queries") -> None:
        self._file = file

    def __getitem__(self, name: str) -> LiteralString:
        return _named(self._file)[name]

    def __contains__(self, name: object) -> bool:
        return name in _named(self._file)


queries = _Queries()
lease_queries = _Queries("lease_queries")
alert_queries = _Queries("alert_queries")
local_alert_queries = _Queries("local_alert_queries")

__all__ = ["BASELINE", "alert_queries", "lease_queries", "local_alert_queries", "queries",
           "run_script", "script"]
