"""The admin API's one exception mapping, registered on its router when the app is built.

A handler calls its store and lets whatever it raises go: our own refusals answer as
they are (400, 404, 409 …), as do Litestar's (a body or a parameter refused); a stale
revision of a key-store write (:class:`~gateway.errors.RevisionConflict`) is the 412 of
its ``If-Match``; anything else is a store that failed (SQLite, Postgres, a closed
pool): the 503 ``governance_unavailable`` with ``Retry-After``, whose log line names
the failure while the client reads only the kind's own sentence. The answer is drawn
by the ingress's one renderer (:func:`gateway.ingress.error_handler`), in OpenAI's shape.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.types import ExceptionHandlersMap

from gateway.errors import (
    GovernanceUnavailable,
    InferplaneError,
    PreconditionFailed,
    RevisionConflict,
)
from gateway.ingress import error_handler


def admin_error(exc: Exception) -> Exception:
    """``exc`` as the admin API answers it (see the module docstring)."""
    if isinstance(exc, RevisionConflict):
        return PreconditionFailed(exc.message, param="If-Match")
    if isinstance(exc, InferplaneError | HTTPException):
        return exc
    failed = GovernanceUnavailable(f"store unavailable: {type(exc).__name__}: {exc}")
    failed.__cause__ = exc  # internal: logged, never shown
    return failed


def admin_error_handler(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Litestar's exception handler for every admin route."""
    return error_handler(request, admin_error(exc))


EXCEPTION_HANDLERS: ExceptionHandlersMap = {Exception: admin_error_handler}
