"""Webhook delivery of budget alerts: signed POSTs, retried with backoff.

The body is the event's JSON (:meth:`AlertEvent.body`); the header
``x-inferplane-signature: sha256=<hex>`` is the HMAC-SHA256 of exactly those bytes with
the secret ``server.alerts.secret_ref`` names, so a receiver verifies it before trusting
the event (``hmac.compare_digest``). ``x-inferplane-event-id`` repeats the event id, the
same on every retry. A connection error, a timeout, 408, 429 or a 5xx is retried
(``retries`` times, waiting ``retry_backoff_s`` doubled after each, at most 60 s); any
other status is final. A failed delivery is the caller's to log and count: it never
reaches a request.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from dataclasses import dataclass

import httpx

_MAX_BACKOFF_S = 60.0


def signature(body: bytes, secret: str) -> str:
    """The ``x-inferplane-signature`` value of ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _retryable(status: int) -> bool:
    return status in (408, 429) or status >= 500


@dataclass(frozen=True)
class Delivery:
    ok: bool
    attempts: int
    error: str | None = None


class WebhookSender:
    """POSTs events to one URL (``server.alerts``)."""

    def __init__(self, url: str, *, secret: str, timeout_s: float = 5.0, retries: int = 5,
                 retry_backoff_s: float = 1.0) -> None:
        self.url = url
        self._secret = secret
        self._timeout = timeout_s
        self._retries = retries
        self._backoff = retry_backoff_s
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=self._timeout, follow_redirects=False)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def deliver(self, body: bytes, *, event_id: str) -> Delivery:
        """POST ``body``; retried as the module docstring says."""
        if self._client is None:
            return Delivery(ok=False, attempts=0, error="webhook sender is not started")
        headers = {"content-type": "application/json", "x-inferplane-event-id": event_id,
                   "x-inferplane-signature": signature(body, self._secret)}
        error = ""
        for attempt in range(self._retries + 1):
            if attempt:
                await asyncio.sleep(min(_MAX_BACKOFF_S, self._backoff * 2 ** (attempt - 1)))
            try:
                response = await self._client.post(self.url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
                continue
            if 200 <= response.status_code < 300:
                return Delivery(ok=True, attempts=attempt + 1)
            error = f"HTTP {response.status_code}"
            if not _retryable(response.status_code):
                return Delivery(ok=False, attempts=attempt + 1, error=error)
        return Delivery(ok=False, attempts=self._retries + 1, error=error)
