"""The webhook checker: the operator's own service asked about each request's text.

After the built-in detectors have acted (so the checker sees placeholders, never a
masked or pseudonymized value), the request's text fields are POSTed as JSON
``{"request_id", "team_id", "endpoint", "texts": [{"path", "text"}]}`` to
``guardrails.webhook.url``. It answers ``{"action": "allow"}`` or ``{"action":
"block", "detector": "<name>"}`` (a block is the client's ``400 guardrail_blocked``
naming ``webhook:<name>``). When it does not answer within ``timeout_s``, cannot be
reached, answers another status or another body, ``failure`` decides: ``open`` lets the
request through (logged, counted), ``closed`` refuses it with ``503
guardrail_unavailable`` (retryable; nothing admitted, nothing charged). No default:
the operator chooses, as a policy's ``failurePolicy``.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx
import msgspec

from gateway.errors import InferplaneError
from gateway.guardrails._guard import Guard, GuardrailBlocked, walk
from gateway.guardrails._settings import GuardrailWebhook

log = logging.getLogger("mayu.guardrails")

_NAME = re.compile(r"[a-z0-9_.-]{1,40}")


class GuardrailUnavailable(InferplaneError):
    """The guardrail checker did not answer and guardrails.webhook.failure is closed."""

    status = 503
    openai_type = "server_error"
    anthropic_type = "overloaded_error"
    code = "guardrail_unavailable"
    should_retry = True


def _texts(doc: dict[str, Any]) -> list[dict[str, str]]:
    found: list[dict[str, str]] = []

    def keep(text: str, path: str) -> str:
        found.append({"path": path, "text": text})
        return text
    walk(doc, keep)
    return found


async def check(hook: GuardrailWebhook, guard: Guard, doc: dict[str, Any], *,
                endpoint: str, team_id: str) -> None:
    """Ask the checker about ``doc`` (already screened); raises to refuse."""
    payload = {"request_id": guard.request_id, "team_id": team_id, "endpoint": endpoint,
               "texts": _texts(doc)}
    try:
        async with httpx.AsyncClient(timeout=hook.timeout_s) as client:
            r = await client.post(hook.url, content=msgspec.json.encode(payload),
                                  headers={"content-type": "application/json"})
        verdict = msgspec.json.decode(r.content) if r.status_code == 200 else None
        action = verdict.get("action") if isinstance(verdict, dict) else None
        if action not in ("allow", "block"):
            raise ValueError(f"answered HTTP {r.status_code} without an action")
    except (httpx.HTTPError, ValueError, msgspec.DecodeError) as exc:
        why = type(exc).__name__ if isinstance(exc, httpx.HTTPError) else str(exc)
        outcome = "failed_open" if hook.failure == "open" else "failed_closed"
        if guard.metrics is not None:
            guard.metrics.webhook.labels(outcome).inc()
        log.warning("request %s: guardrail checker %s (%s)", guard.request_id,
                    outcome.replace("_", " "), why)
        if hook.failure == "closed":
            raise GuardrailUnavailable() from None
        return
    if guard.metrics is not None:
        guard.metrics.webhook.labels(action).inc()
    if action == "block":
        name = str(verdict.get("detector", "")) if isinstance(verdict, dict) else ""
        name = name if _NAME.fullmatch(name) else "checker"
        if guard.metrics is not None:
            guard.metrics.blocked.labels("webhook", "request").inc()
        raise GuardrailBlocked(f"webhook:{name}", "the request")
