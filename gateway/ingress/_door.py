"""What every request's path and query must be before a handler reads them.

A NUL byte (``%00``) is text SQLite keeps and Postgres refuses (``text`` cannot hold
it): a filter or a path parameter holding one reached the shared profile's store and
came back as a 500 (a data error) or a 503 ("governance store unavailable"), while the
local profile answered 200. So it is refused here, once, for every Litestar route on
every profile, before any handler or store sees it: a 400 in the route's own error shape
naming the parameter. The generation routes' fixed paths never carry one.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from litestar import Request

from gateway.errors import BadRequest

_NUL = "\x00"


def refuse_nul_bytes(request: Request[Any, Any, Any]) -> None:
    """Litestar's ``before_request``: a NUL byte in the path or in a query parameter's
    name or value is a 400; anything else goes on to the handler."""
    if _NUL in request.scope["path"]:
        raise BadRequest("the path holds a NUL byte (%00), which no name or id may hold",
                         param="path")
    query = request.scope.get("query_string", b"").decode("latin-1")
    if "%00" not in query and _NUL not in query:
        return
    for name, value in parse_qsl(query, keep_blank_values=True, encoding="utf-8",
                                 errors="replace"):
        if _NUL in name or _NUL in value:
            shown = name.replace(_NUL, "\\0")
            raise BadRequest(f"query parameter {shown}: holds a NUL byte (%00), which no "
                             "filter may hold", param=shown)
