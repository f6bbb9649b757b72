"""A request's JSON body read into its wire type, the one way inferplaned's routes read
one: its size bounded first (413 naming the setting), its nesting checked before it is
decoded (so no decoder recursion can fail), then decoded into the wire type, whose
bounded fields make an out-of-range value a 400 naming its path (``... - at `$.seq```),
never a database error."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from litestar import Request

from gateway.errors import BadRequest, PayloadTooLarge
from gateway.jsondepth import check_json_depth

T = TypeVar("T")


async def bounded_body(request: Request[Any, Any, Any], *, limit: str) -> bytes:
    """The request's body; 413 when it is larger than the config's ``limit`` setting."""
    body = await request.body()
    most = getattr(request.app.state.config, limit)
    if len(body) > most:
        raise PayloadTooLarge(f"body: larger than {limit} ({most})")
    return body


def decode_body(body: bytes, kind: type[T], *, what: str) -> T:
    """``body`` as a ``kind``; else a 400 saying it is not ``what``, and why."""
    check_json_depth(body, what="body")
    try:
        return msgspec.json.decode(body, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadRequest(f"body: not {what}: {exc}") from exc
