"""The one renderer of errors: status, headers, the calling protocol's body shape, the
request's metrics label and, for errors before an attempt was admitted, its audit line.

An error whose message names internals (a provider's transport error, a database
error: :attr:`gateway.errors.InferplaneError.internal`) reaches the client as its kind's
own sentence and the request id; the message itself is logged here with the request id
(and is in the audit line: the attempt's settlement detail, or this module's).
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar import MediaType
from litestar.exceptions import HTTPException

from gateway.errors import (
    BadRequest,
    InferplaneError,
    NotFound,
    Unauthenticated,
    anthropic_error_body,
    openai_error_body,
)
from gateway.ingress._attempt import Call
from gateway.ingress._context import Gateway
from gateway.ingress._ratelimit import window_headers
from gateway.ingress._reply import Reply
from gateway.keys import Principal

log = logging.getLogger("mayu.ingress")


def as_inferplane(exc: Exception) -> InferplaneError:
    if isinstance(exc, InferplaneError):
        return exc
    if isinstance(exc, HTTPException):
        # Litestar's own refusals (no such route, wrong method, client gone mid-body):
        # keep their status, pick the closest of our error kinds for type and code.
        detail = str(exc.detail)
        param = None
        if isinstance(exc.extra, list) and exc.extra:
            # A body or parameter Litestar refused (the admin API): say which and why.
            problems = [e for e in exc.extra if isinstance(e, dict)]
            detail += ": " + "; ".join(f"{e.get('key') or e.get('source')}: "
                                       f"{e.get('message')}" for e in problems)
            param = next((str(e["key"]) for e in problems if e.get("key")), None)
        mapped: InferplaneError
        if exc.status_code == 401:
            mapped = Unauthenticated(detail)
        elif exc.status_code in (404, 405):
            mapped = NotFound(detail)
        elif exc.status_code >= 500:
            mapped = InferplaneError(detail)
        else:
            mapped = BadRequest(detail, param=param)
        # status is a ClassVar (each kind's default); this one instance keeps Litestar's
        # own status (405, 413, ...), which the renderer reads from the instance.
        mapped.status = exc.status_code  # type: ignore[misc]
        return mapped
    log.exception("unhandled error", exc_info=exc)
    return InferplaneError()


def codex_usage_limit(err: InferplaneError, user_agent: str | None,
                      body: dict[str, Any]) -> int | None:
    """For Codex CLI, a spent day/month window in the one shape it stops on.

    Codex (``codex_exec``/``codex_cli_rs`` User-Agents) retries every other non-400
    status five times with backoff (~6.5 s for a 402, measured with 0.171.0) and stops at
    once only on a 429 whose ``error.type`` is ``usage_limit_reached``; it then shows
    "You've hit your usage limit. Try again at <resets_at>". So a refusal that cannot
    clear before its window resets is sent to Codex as that 429 (the same message, code,
    ``x-should-retry: false`` and ratelimit headers; ``resets_at`` in epoch seconds).
    Returns the status to send, or None for every other client and refusal. The audit
    line keeps the refusal as governance decided it (402 budget_exhausted…)."""
    if err.window is None or not (user_agent or "").startswith("codex_"):
        return None
    body["error"]["type"] = "usage_limit_reached"
    body["error"]["resets_at"] = int(err.window.resets.timestamp())
    return 429


def error_reply(gw: Gateway | None, exc: Exception, *, anthropic: bool, path: str,
                route: str, request_id: str | None, principal: Principal | None,
                call: Call | None, user_agent: str | None = None) -> Reply:
    """``exc`` as the answer: Anthropic's shape or OpenAI's, the request id header, the
    ``mayu_requests`` count under ``route``, and the audit line of a request that has a
    request id and no audit line yet (refusals and upstream failures were audited by
    their attempt), so every request leaves one."""
    err = as_inferplane(exc)
    if err.internal:
        log.warning("request %s answered %d %s: %s", request_id or "-", err.status,
                    err.code, err.message)
    body = (anthropic_error_body(err, request_id=request_id) if anthropic
            else openai_error_body(err, request_id=request_id))
    status = err.status
    if not anthropic:
        status = codex_usage_limit(err, user_agent, body) or status
    headers = err.headers()
    if err.window is not None:
        headers.update(window_headers(err.window, anthropic=anthropic))
    if request_id:
        headers["x-inferplane-request-id"] = request_id
    if gw is not None:
        gw.metrics.request_done(route, status)
        if request_id and (call is None or not call.audited):
            gw.audit.write({"request_id": request_id, "path": path,
                            "key_id": principal.key_id if principal else None,
                            "team_id": principal.team_id if principal else None,
                            "status": status, "error": err.code, "detail": err.message})
    return Reply(status, headers, MediaType.JSON.value, msgspec.json.encode(body))
