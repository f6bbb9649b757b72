"""The built-in ``mock`` provider kind: the mock model answering in-process (no HTTP).

It speaks both protocols and streams chunk by chunk with the configured latency, so
demos, tests and benchmarks exercise the same relay and usage path as a real upstream.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from gateway.config import ProviderSettings
from gateway.mock import MockStreamCut, plan_count, plan_reply, play
from gateway.providers._base import DispatchFailed, Protocol_, UpstreamResponse
from gateway.providers._count import parse_count
from gateway.usage import Endpoint


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def _cuttable(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A deliberate mock cut looks like a broken upstream connection to the relay."""
    try:
        async for event in events:
            yield event
    except MockStreamCut as exc:
        raise DispatchFailed(f"mock: {exc}") from exc


class MockProvider:
    def __init__(self, settings: ProviderSettings) -> None:
        self.name = settings.name
        self.kind = "mock"
        self._latency_s = settings.latency_ms / 1000
        self.ledger: deque[dict[str, Any]] = deque(maxlen=1000)
        """The last reports, for debugging; bounded so a long run cannot grow it."""

    def speaks(self, protocol: Protocol_) -> bool:
        return True

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @property
    def counts_tokens(self) -> bool:
        return True

    async def count_input_tokens(self, body: bytes, *, headers: dict[str, str]) -> int:
        """The mock's ``count_tokens``: what it would bill for the same body."""
        reply = plan_count(msgspec.json.decode(body))
        if reply.start_delay_s:
            await asyncio.sleep(reply.start_delay_s)
        return parse_count(reply.status, reply.body or b"", provider=self.name)

    async def send(self, endpoint: Endpoint, body: bytes, *,
                   headers: dict[str, str]) -> UpstreamResponse:
        started = time.perf_counter()
        reply = plan_reply(endpoint, msgspec.json.decode(body))
        if reply.start_delay_s:
            await asyncio.sleep(reply.start_delay_s)
        if reply.events:
            return UpstreamResponse(status=reply.status, content_type="text/event-stream",
                                    chunks=_cuttable(play(reply, latency_s=self._latency_s,
                                                          record=self.ledger.append)))
        if self._latency_s + reply.body_delay_s:
            await asyncio.sleep(self._latency_s + reply.body_delay_s)
        if reply.entry is not None:
            self.ledger.append(reply.entry)
        return UpstreamResponse(status=reply.status, content_type="application/json",
                                chunks=_once(reply.body or b""),
                                elapsed_s=time.perf_counter() - started)
