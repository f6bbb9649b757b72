"""What a provider is to the request path: send bytes, get a status and a byte stream.

Failures are classified by whether the request may have reached the upstream, because
that decides settlement: :class:`NotDispatched` (connect error, pool timeout — nothing
was sent, full refund) versus :class:`DispatchFailed` (timeout or broken connection after
sending — the upstream may have done and billed the work, so bounds are kept).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from gateway.usage import Endpoint

Protocol_ = Literal["openai", "anthropic"]

PASSED_HEADERS = ("retry-after", "retry-after-ms", "x-request-id", "request-id")
"""Upstream response headers relayed to the client: when to retry, and the upstream's
own request id for support tickets."""

RATELIMIT_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")
"""Upstream response headers that tell a deployment's rate-limit headroom (OpenAI's and
Anthropic's): kept for routing (``gateway.routing``), not relayed (the client gets the
gateway's own)."""

TRACE_HEADERS = ("traceparent", "tracestate")
"""W3C trace context the gateway puts in an attempt's headers (``gateway.telemetry``),
passed upstream by every HTTP kind."""


def ratelimit_of(headers: dict[str, str]) -> dict[str, str]:
    """The rate-limit headers among an upstream answer's (lowercase names)."""
    return {k: v for k, v in headers.items() if k.startswith(RATELIMIT_PREFIXES)}


def with_trace(headers: dict[str, str], client_headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with the attempt's trace context, when it is traced."""
    if "traceparent" in client_headers:
        for name in TRACE_HEADERS:
            if name in client_headers:
                headers[name] = client_headers[name]
    return headers


RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504, 529})
"""Upstream statuses after which a fallback deployment is tried."""


class UpstreamFailure(Exception):
    """The upstream call failed without an HTTP answer."""

    dispatched = True


class NotDispatched(UpstreamFailure):
    """Nothing reached the upstream (connect error, pool timeout)."""

    dispatched = False


class DispatchFailed(UpstreamFailure):
    """The request may have reached the upstream (timeout, connection broken)."""


async def _nothing() -> None:
    return None


@dataclass
class UpstreamResponse:
    """An upstream answer whose body is read lazily (``read``) or relayed (``chunks``)."""

    status: int
    content_type: str
    chunks: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]] = field(default=_nothing)
    elapsed_s: float = 0.0
    """Time to response headers."""
    headers: dict[str, str] = field(default_factory=dict)
    """Upstream headers worth passing to the client (see ``PASSED_HEADERS``)."""
    ratelimit: dict[str, str] = field(default_factory=dict)
    """The upstream's rate-limit headers (``RATELIMIT_PREFIXES``): routing's headroom."""

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self.chunks]
        await self.close()
        return b"".join(parts)


class Provider(Protocol):
    name: str
    kind: str

    def speaks(self, protocol: Protocol_) -> bool:
        """Whether this provider accepts that ingress protocol's bodies verbatim."""

    async def send(self, endpoint: Endpoint, body: bytes, *,
                   headers: dict[str, str]) -> UpstreamResponse:
        """Send one request; raise :class:`UpstreamFailure` when there is no HTTP answer."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...
