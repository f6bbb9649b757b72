"""``GET /v1/usage`` rows for the local store, aggregated from its permits.

A permit counts once in the day and month windows it was admitted in (the windows it
captured, so a request settled after midnight stays in its own day). Pending and
invalid permits count their bounds as *reserved* (their reservations still bind);
settled permits count what settlement committed and, apart, their *liability* (the
unobserved remainder of an uncertain outcome, DESIGN §5). A request cancelled before dispatch
is not counted as a request. One statement (``usage`` in ``sql/local/governance.sql``)
answers for every scope and both windows.
"""

from __future__ import annotations

import sqlite3
from typing import Literal

import sql
from gateway.governance._model import UsageRow
from gateway.localdb import Statements

_SQL = Statements(sql.local_governance)

_Scope = Literal["key", "team", "user"]
_Window = Literal["day", "month"]

_SCOPES: tuple[_Scope, ...] = ("key", "team", "user")
_WINDOWS: tuple[_Window, ...] = ("day", "month")


def usage_rows(conn: sqlite3.Connection, *, day: str, month: str, key_id: str | None,
               team_id: str | None) -> list[UsageRow]:
    """Per key, team and user, per day and month, in that order, then by id. Filtered to
    one key and its team: key and user rows follow the key, team rows the team (given,
    or the key's)."""
    periods = (day, month)
    params = {"day": day, "month": month, "key_id": key_id, "team_id": team_id}
    return [UsageRow(scope=_SCOPES[r["scope"]], id=r["id"], window=_WINDOWS[r["win"]],
                     period=periods[r["win"]], tokens_committed=r["tc"],
                     tokens_reserved=r["tr"], usd_committed=r["uc"], usd_reserved=r["ur"],
                     requests=r["requests"], tokens_liability=r["tl"],
                     usd_liability=r["ul"])
            for r in _SQL["usage"].execute(conn, params)]
