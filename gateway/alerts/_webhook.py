"""Webhook delivery of budget alerts: signed POSTs, retried with backoff.

The body is the event's JSON (:meth:`AlertEvent.body`); the header
``x-inferplane-signature: sha256=<hex>`` is the HMAC-SHA256 of exactly those bytes with
the secret ``server.alerts.secret_ref`` names, so a receiver verifies it before trusting
the event (``hmac.compare_digest``). ``x-inferplane-event-id`` repeats the event id, the
same on every retry. A connection error, a timeout, 408, 429 or a 5xx is retried
(``retries`` times, waiting ``retry_backoff_s`` doubled after each, at most 60 s); any
other status is final. A failed delivery is the caller's to log and count: it never
reaches a request.

The URL is a secret where the receiver puts its token in the path (a Slack incoming
webhook, ``https://hooks.slack.com/services/T…/B…/X…``): it is never logged. What the
sender shows is :func:`shown_url` (``https://hooks.slack.com/…``); while it is started,
the URL in httpx's own ``HTTP Request: POST …`` INFO line is replaced by that, and a
failed delivery's error text is scrubbed of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from dataclasses import dataclass

import httpx

_MAX_BACKOFF_S = 60.0
_HTTPX_LOG = logging.getLogger("httpx")


def shown_url(url: str) -> str:
    """What of a webhook URL may be logged: scheme and host (and a port), never the path,
    query or user info, which may hold the receiver's token."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return "<invalid webhook URL>"
    if not parsed.host:
        return "<invalid webhook URL>"
    host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
    port = f":{parsed.port}" if parsed.port is not None else ""
    return f"{parsed.scheme}://{host}{port}/…"


def _normalized(url: str) -> str:
    """The URL as httpx writes it in its log line (``url`` itself if it cannot parse)."""
    try:
        return str(httpx.URL(url))
    except (httpx.InvalidURL, TypeError):
        return url


class _HideURL(logging.Filter):
    """Replaces one URL, among a log record's arguments, by its shown form (httpx logs
    ``request.url`` as an argument of every request at INFO)."""

    def __init__(self, url: str, shown: str) -> None:
        super().__init__()
        self._url = _normalized(url)
        self._shown = shown

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(self._hides(a) for a in args):
            record.args = tuple(self._shown if self._hides(a) else a for a in args)
        return True

    def _hides(self, value: object) -> bool:
        return isinstance(value, (httpx.URL, str)) and str(value) == self._url


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
        """The full URL: a secret (never log it; :attr:`shown_url` is safe)."""
        self.shown_url = shown_url(url)
        self._hide = _HideURL(url, self.shown_url)
        self._secret = secret
        self._timeout = timeout_s
        self._retries = retries
        self._backoff = retry_backoff_s
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        _HTTPX_LOG.addFilter(self._hide)
        self._client = httpx.AsyncClient(timeout=self._timeout, follow_redirects=False)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
        _HTTPX_LOG.removeFilter(self._hide)

    def _scrub(self, text: str) -> str:
        """``text`` without the URL or its path and query (an error may quote them)."""
        secrets = [self.url, _normalized(self.url)]
        with contextlib.suppress(httpx.InvalidURL, TypeError):
            secrets.append(httpx.URL(self.url).raw_path.decode("ascii", "replace"))
        for secret in sorted(secrets, key=len, reverse=True):  # the longest first
            if secret and secret != "/":
                text = text.replace(secret, self.shown_url)
        return text

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
                error = self._scrub(f"{type(exc).__name__}: {exc}")
                continue
            if 200 <= response.status_code < 300:
                return Delivery(ok=True, attempts=attempt + 1)
            error = f"HTTP {response.status_code}"
            if not _retryable(response.status_code):
                return Delivery(ok=False, attempts=attempt + 1, error=error)
        return Delivery(ok=False, attempts=self._retries + 1, error=error)
