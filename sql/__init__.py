"""The SQL that does the governance work, as reviewed ``.sql`` files (procrastinate style).

Postgres, the present (one current definition of everything):
- ``schema.sql`` (every table and index), ``governance.sql`` (admission and settlement
  functions) and ``lease.sql`` (the lease ledger's functions), installed in this order
  (:data:`SCHEMA`); ``drop_functions.sql`` drops every ``inferplane_*`` function.
  Migrations build the same schema: the 0.1.0 baseline installs its frozen files
  (``migrations/baseline/``, :data:`BASELINE`, :func:`baseline_script`) and each later
  revision changes it (CONTRIBUTING.md); a test compares the two.
- ``queries.sql``: named queries, each introduced by a ``-- name: <name>`` line and
  exposed through :data:`queries` (``%(param)s`` placeholders only); ``lease_queries.sql``
  likewise through :data:`lease_queries` (the control plane's lease ledger calls) and
  ``alert_queries.sql`` through :data:`alert_queries` (budget alerts and the cluster
  gauges), ``identity_queries.sql`` through :data:`identity_queries` (inferplaned's token
  exchange and user revocation), ``routing_queries.sql`` through :data:`routing_queries`
  (cache affinity's shared pins), ``usage_queries.sql`` through :data:`usage_queries`
  (lease planes' request logs, stored by inferplaned).

SQLite (the local profile's file, ``<data_dir>/mayu.db``): ``local/keys.sql``,
``local/governance.sql``, ``local/lease.sql``, ``local/usage.sql`` (the lease plane's
usage spool) and ``local/alerts.sql``, one per store,
each its ``schema`` (run with executescript when the store opens) then one named
statement per call (``:name`` parameters), exposed through :data:`local_keys`,
:data:`local_governance`, :data:`local_lease` and :data:`local_alerts`.

The agents' own usage reports (gateway/otlp_import): ``agent_usage_queries.sql`` and
``local/agent_usage.sql``, through :data:`agent_usage_queries` and :data:`local_agent_usage`.

Files are read once with :mod:`importlib.resources`, so they ship as package data. After
a release, a changed function is a new ``_vN+1`` created by a migration (CONTRIBUTING.md).
"""

from __future__ import annotations

import hashlib
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


SCHEMA = ("schema", "governance", "lease")
"""The files that build the present Postgres schema, in order."""

BASELINE = ("schema", "key_rotations", "members", "request_log", "governance", "lease")
"""The 0.1.0 baseline's files (``migrations/baseline/``), in the order it installs them."""

BASELINE_SHA256 = {
    "key_rotations": "d534957dd6f998de6b6b463cc10af3ddfb50abbf0a39962b69cac95d8528ce48",
    "members": "de4076260a628b2fd4853f57d219b9482dfaed315a6461dd990b38e47fffc2ea",
    "request_log": "0ef055c272667a021f6a1ae31ee6d00972d9db96a02900ff0fad3f0b635d6769",
    "schema": "a58b9f6ea42434ad6e44ec4b82932a8b7efb6d3ca8becc2ad339acb270f29ed5",
    "governance": "4b19adb2ef14f7f878ac6316b21ea335d8507e873877fe1a8987c342ea211761",
    "lease": "f558d8842c0564b978af6e24c1849423cafdd76ae8e44fbe244ab41f454b03cc",
}
"""The sha256 of each file of the 0.1.0 baseline as released
(``migrations/baseline/<name>.sql``, frozen: CONTRIBUTING.md)."""


def baseline_script(name: str) -> LiteralString:
    """The released 0.1.0 text of baseline file ``name`` (``migrations/baseline/<name>.sql``),
    refused if it is not the text :data:`BASELINE_SHA256` records."""
    frozen = resources.files("migrations").joinpath("baseline", f"{name}.sql")
    text = cast(LiteralString, frozen.read_text(encoding="utf-8"))  # type: ignore[redundant-cast]
    if hashlib.sha256(text.encode()).hexdigest() != BASELINE_SHA256[name]:
        raise RuntimeError(
            f"migrations/baseline/{name}.sql is not the text 0.1.0 released: a released "
            "baseline is never edited; restore it (git show v0.1.0:migrations/baseline/"
            f"{name}.sql) and make the change a new migration (CONTRIBUTING.md)")
    return text


def run_script(op: Any, name: str, *, text: str | None = None) -> None:
    """Run ``sql/<name>.sql`` (or ``text``) from an alembic migration (``op`` is
    ``alembic.op``).

    Whole files (several statements, PL/pgSQL bodies with ':=' and '%') go straight to
    the driver: SQLAlchemy's text() would parse ':name' as bind parameters."""
    text = script(name) if text is None else text
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
identity_queries = _Queries("identity_queries")
routing_queries = _Queries("routing_queries")
usage_queries = _Queries("usage_queries")
local_keys = _Queries("local/keys")
local_governance = _Queries("local/governance")
local_lease = _Queries("local/lease")
local_usage = _Queries("local/usage")
local_alerts = _Queries("local/alerts")
agent_usage_queries = _Queries("agent_usage_queries")
local_agent_usage = _Queries("local/agent_usage")

__all__ = ["BASELINE", "BASELINE_SHA256", "SCHEMA", "agent_usage_queries", "alert_queries",
           "baseline_script", "local_agent_usage",
           "identity_queries", "lease_queries", "local_alerts", "local_governance",
           "local_keys", "local_lease", "local_usage", "queries", "routing_queries",
           "run_script", "script", "usage_queries"]
