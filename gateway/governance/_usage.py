"""``GET /v1/usage`` rows for the local store, aggregated from its permits.

A permit counts once in the day and month windows it was admitted in (the windows it
captured, so a request settled after midnight stays in its own day). Pending and
invalid permits count their bounds as *reserved* (their reservations still bind);
settled permits count what settlement committed and, apart, their *liability* (the
unobserved remainder of an uncertain outcome, DESIGN §5). A request cancelled before dispatch
is not counted as a request.
"""

from __future__ import annotations

import sqlite3
from typing import Literal

from gateway.governance._model import UsageRow

_Scope = Literal["key", "team", "user"]
_Window = Literal["day", "month"]

_SCOPES: tuple[tuple[_Scope, str], ...] = (
    ("key", "p.key_id"), ("team", "p.team_id"), ("user", "p.user"))

_SELECT = """
SELECT {column} AS id,
  SUM(CASE WHEN p.status = 'settled' THEN s.tokens_committed ELSE 0 END) AS tc,
  SUM(CASE WHEN p.status = 'settled' THEN 0 ELSE p.token_bound END) AS tr,
  SUM(CASE WHEN p.status = 'settled' THEN s.usd_committed ELSE 0 END) AS uc,
  SUM(CASE WHEN p.status = 'settled' THEN 0 ELSE p.usd_bound END) AS ur,
  SUM(CASE WHEN p.status = 'settled' THEN s.tokens_liability ELSE 0 END) AS tl,
  SUM(CASE WHEN p.status = 'settled' THEN s.usd_liability ELSE 0 END) AS ul,
  SUM(CASE WHEN s.kind = 'cancelled' THEN 0 ELSE 1 END) AS requests
FROM gov_permits p LEFT JOIN gov_settlements s ON s.permit_id = p.id
WHERE p.{period} = ? AND {column} IS NOT NULL AND {where}
GROUP BY {column} ORDER BY {column}
"""


def _filter(scope: str, key_id: str | None, team_id: str | None) -> tuple[str, list[str]]:
    """Filtered to one key and its team: key and user rows follow the key, team rows the
    team (given, or the key's)."""
    if scope == "team":
        if team_id is not None:
            return "p.team_id = ?", [team_id]
        if key_id is not None:
            return ("p.team_id IN (SELECT team_id FROM gov_permits WHERE key_id = ?)",
                    [key_id])
        return "1 = 1", []
    if key_id is not None:
        return "p.key_id = ?", [key_id]
    if team_id is not None:
        return "p.team_id = ?", [team_id]
    return "1 = 1", []


def usage_rows(conn: sqlite3.Connection, *, day: str, month: str, key_id: str | None,
               team_id: str | None) -> list[UsageRow]:
    rows: list[UsageRow] = []
    for scope, column in _SCOPES:
        where, args = _filter(scope, key_id, team_id)
        windows: tuple[tuple[_Window, str], ...] = (("day", day), ("month", month))
        for window, period in windows:
            sql = _SELECT.format(column=column, period=window, where=where)
            for r in conn.execute(sql, [period, *args]):
                rows.append(UsageRow(
                    scope=scope, id=r["id"], window=window,
                    period=period, tokens_committed=r["tc"], tokens_reserved=r["tr"],
                    usd_committed=r["uc"], usd_reserved=r["ur"], requests=r["requests"],
                    tokens_liability=r["tl"], usd_liability=r["ul"]))
    return rows
