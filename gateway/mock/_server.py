"""``mayu mock-upstream``: the mock model served over real HTTP, with its own ledger.

OpenAI-compatible (``/v1/chat/completions``, ``/v1/responses``, ``/v1/embeddings``,
``/v1/models``) and Anthropic-compatible (``/v1/messages``, ``/v1/messages/count_tokens``
counting as the mock bills), real SSE for streams. The ledger (``GET``/``DELETE
/__mock/ledger``) is the upstream's own record of the usage it reported, one entry per
response; tests and benches price from it, independently of the gateway.
``GET /__mock/counts`` says how many token counts it answered (cleared with the ledger).
``GET /__mock/inflight`` says how many requests are open now and the most that were open
at once (``DELETE`` starts a new high-water mark): what a concurrency limit promises.

For routing tests: ``POST /__mock/fail`` ``{"status": 503, "retry_after": 2}`` makes every
generation request from then on answer that status (counted in ``/__mock/counts`` as
``failed``) until ``DELETE /__mock/fail``; with ``prompt_cache`` (``--prompt-cache``) a
Messages request is billed by the process's prompt cache (``gateway.mock._cache``) and
``POST /__mock/clock`` ``{"advance_s": 301}`` moves its clock forward. ``POST
/__mock/headers`` ``{"anthropic-ratelimit-requests-remaining": "0", …}`` adds those
headers to every generation answer until ``DELETE /__mock/headers`` (rate-limit
headroom, as real upstreams report it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, delete, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.response import Stream

from gateway.jsondepth import json_too_deep, too_deep_error
from gateway.mock._cache import PromptCache
from gateway.mock._wire import MockReply, error_reply, plan_count, plan_reply, play
from gateway.usage import Endpoint

_ANSWERED: dict[str, Endpoint] = {"/v1/chat/completions": "chat", "/v1/responses": "responses",
                                  "/v1/embeddings": "embeddings", "/v1/messages": "messages"}
"""The generation routes, each answered as that endpoint of its provider."""


class Ledger:
    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.counts = 0
        """Token counts answered (``/v1/messages/count_tokens``)."""
        self.failed = 0
        """Generation requests answered with the ``/__mock/fail`` status."""
        self.fail: tuple[int, int | None] | None = None
        """(status, retry-after seconds) while ``/__mock/fail`` is on."""
        self.headers: dict[str, str] = {}
        """Added to every generation answer (``/__mock/headers``)."""

    def record(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)


class Gauge:
    """Requests open at the upstream: from the handler's start to the last byte of the
    answer (or the stream's end, a client's disconnect included), and their high-water
    mark."""

    def __init__(self) -> None:
        self.open = 0
        self.high = 0

    def enter(self) -> None:
        self.open += 1
        self.high = max(self.high, self.open)

    def leave(self) -> None:
        self.open -= 1


async def _held(events: AsyncIterator[bytes], gauge: Gauge) -> AsyncIterator[bytes]:
    """``events``, leaving ``gauge`` when the stream ends however it ends."""
    try:
        async for event in events:
            yield event
    finally:
        gauge.leave()


def _bad(message: str) -> Response[bytes]:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": None}}
    return Response(msgspec.json.encode(body), status_code=400, media_type="application/json")


def create_mock_app(*, latency_ms: int = 0, prompt_cache: bool = False) -> Litestar:
    """The mock upstream as an ASGI app (``latency_ms`` before first byte and per chunk;
    ``prompt_cache``: Messages requests billed by a per-process prompt cache)."""
    ledger = Ledger()
    gauge = Gauge()
    latency_s = latency_ms / 1000
    cache = PromptCache() if prompt_cache else None

    async def decode(request: Request[Any, Any, Any]) -> dict[str, Any] | Response[bytes]:
        raw = await request.body()
        if json_too_deep(raw):  # as a provider would: a 400, never a crash
            return _bad(too_deep_error().message)
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return _bad("request body is not valid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return _bad("model: required")
        return body

    async def answer(request: Request[Any, Any, Any], endpoint: Endpoint) -> Any:
        gauge.enter()
        streamed = False
        try:
            reply = await respond(request, endpoint)
            streamed = isinstance(reply, Stream)
            return reply
        finally:
            if not streamed:
                gauge.leave()

    async def respond(request: Request[Any, Any, Any], endpoint: Endpoint) -> Any:
        body = await decode(request)
        if isinstance(body, Response):
            return body
        if ledger.fail is not None:
            ledger.failed += 1
            reply = error_reply("anthropic" if endpoint == "messages" else "openai",
                                *ledger.fail)
        else:
            reply = plan_reply(endpoint, body, bill=cache.classes if cache else None)
        if ledger.headers:
            reply.headers = {**reply.headers, **ledger.headers}
        if reply.start_delay_s:
            await asyncio.sleep(reply.start_delay_s)
        if reply.events:
            return Stream(_held(play(reply, latency_s=latency_s, record=ledger.record),
                                gauge),
                          media_type="text/event-stream", status_code=reply.status,
                          headers={"cache-control": "no-cache", **reply.headers})
        if latency_s + reply.body_delay_s:
            await asyncio.sleep(latency_s + reply.body_delay_s)
        if reply.entry is not None:
            ledger.record(reply.entry)
        return Response(reply.body or b"", status_code=reply.status,
                        media_type="application/json", headers=reply.headers)

    def answering(path: str, endpoint: Endpoint) -> HTTPRouteHandler:
        """The route answering ``path`` as a provider's ``endpoint``."""
        async def handle(request: Request[Any, Any, Any]) -> Any:
            return await answer(request, endpoint)
        return post(path, status_code=200, name=endpoint)(handle)

    @post("/v1/messages/count_tokens", status_code=200)
    async def count_tokens(request: Request[Any, Any, Any]) -> Any:
        body = await decode(request)
        if isinstance(body, Response):
            return body
        for field in ("max_tokens", "stream", "metadata", "temperature"):
            if field in body:  # as Anthropic's endpoint: a Messages-only field is a 400
                return _bad(f"{field}: Extra inputs are not permitted")
        reply: MockReply = plan_count(body)
        if reply.start_delay_s:
            await asyncio.sleep(reply.start_delay_s)
        if reply.status == 200:
            ledger.counts += 1
        return Response(reply.body or b"", status_code=reply.status,
                        media_type="application/json", headers=reply.headers)

    @get("/__mock/counts")
    async def read_counts() -> dict[str, int]:
        return {"counts": ledger.counts, "failed": ledger.failed}

    @post("/__mock/fail", status_code=204)
    async def start_failing(data: dict[str, Any]) -> None:
        retry = data.get("retry_after")
        ledger.fail = (int(data.get("status", 503)), None if retry is None else int(retry))

    @delete("/__mock/fail", status_code=204)
    async def stop_failing() -> None:
        ledger.fail = None

    @post("/__mock/headers", status_code=204)
    async def add_headers(data: dict[str, str]) -> None:
        ledger.headers = {str(k).lower(): str(v) for k, v in data.items()}

    @delete("/__mock/headers", status_code=204)
    async def drop_headers() -> None:
        ledger.headers = {}

    @post("/__mock/clock", status_code=204)
    async def advance_clock(data: dict[str, Any]) -> None:
        if cache is not None:
            cache.skew_s += float(data.get("advance_s", 0))

    @get("/__mock/inflight")
    async def read_inflight() -> dict[str, int]:
        return {"open": gauge.open, "max": gauge.high}

    @delete("/__mock/inflight", status_code=204)
    async def reset_inflight() -> None:
        gauge.high = gauge.open

    @get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": "mock", "object": "model", "created": 0, "owned_by": "mock"}]}

    @get("/__mock/ledger")
    async def read_ledger() -> list[dict[str, Any]]:
        return ledger.entries

    @delete("/__mock/ledger", status_code=204)
    async def clear_ledger() -> None:
        ledger.entries.clear()
        ledger.counts = 0
        ledger.failed = 0
        if cache is not None:
            cache.clear()

    @get(["/healthz", "/readyz"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return Litestar([*(answering(path, endpoint) for path, endpoint in _ANSWERED.items()),
                     count_tokens, models,
                     read_ledger, read_counts, clear_ledger, read_inflight, reset_inflight,
                     start_failing, stop_failing, add_headers, drop_headers, advance_clock,
                     health],
                    openapi_config=None, request_max_body_size=None)
