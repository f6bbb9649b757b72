"""``openai`` and ``anthropic`` provider kinds: one pooled httpx client per provider.

Bodies go upstream as bytes; the response body is relayed with ``aiter_bytes`` as it
arrives (never buffered for streams). ``accept-encoding: identity`` keeps the relayed
bytes equal to what the usage meter reads.

The pool is split into a few shards (independent httpx clients, used round-robin):
httpcore's pool scans every (queued request, connection) pair on each event, so its
cost grows with the square of the concurrency; measured here (32 concurrent requests),
one pool of 200 spent a third of the gateway's CPU in that scan.
"""

from __future__ import annotations

import itertools
import ssl
import time
from collections.abc import AsyncIterator

import certifi
import httpx

from gateway.config import ProviderSettings, resolve_secret
from gateway.providers._base import (
    PASSED_HEADERS,
    DispatchFailed,
    NotDispatched,
    Protocol_,
    UpstreamResponse,
)
from gateway.usage import Endpoint

_OPENAI_PATHS = {"chat": "/chat/completions", "responses": "/responses",
                 "embeddings": "/embeddings"}
_ANTHROPIC_VERSION = "2023-06-01"
_MAX_SHARDS = 16
_PER_SHARD = 8


class HttpProvider:
    """A provider reached over HTTP; ``kind`` is ``openai`` or ``anthropic``."""

    def __init__(self, settings: ProviderSettings, *, index: int = 0) -> None:
        self.name = settings.name
        self.kind: str = settings.kind
        self._settings = settings
        self._where = f"providers[{index}]"
        self._clients: list[httpx.AsyncClient] = []
        self._next: itertools.cycle[httpx.AsyncClient] | None = None
        self._auth: dict[str, str] = {}

    def speaks(self, protocol: Protocol_) -> bool:
        return protocol == self.kind

    async def start(self) -> None:
        s = self._settings
        if s.api_key_ref:
            secret = resolve_secret(s.api_key_ref, key=f"{self._where}.api_key_ref")
            self._auth = ({"x-api-key": secret} if s.kind == "anthropic"
                          else {"authorization": f"Bearer {secret}"})
        shards = max(1, min(_MAX_SHARDS, s.max_connections // _PER_SHARD))
        per_shard = -(-s.max_connections // shards)
        # One TLS context for every shard (httpx's default CA bundle): loading it is slow.
        tls = ssl.create_default_context(cafile=certifi.where())
        self._clients = [httpx.AsyncClient(
            base_url=(s.base_url or "").rstrip("/"),
            timeout=httpx.Timeout(s.timeout_s, connect=s.connect_timeout_s), verify=tls,
            limits=httpx.Limits(max_connections=per_shard,
                                max_keepalive_connections=per_shard),
            headers={"accept-encoding": "identity", "content-type": "application/json"})
            for _ in range(shards)]
        self._next = itertools.cycle(self._clients)

    async def close(self) -> None:
        clients, self._clients, self._next = self._clients, [], None
        for client in clients:
            await client.aclose()

    def _path(self, endpoint: Endpoint) -> str:
        return "/v1/messages" if self.kind == "anthropic" else _OPENAI_PATHS[endpoint]

    def _headers(self, client_headers: dict[str, str]) -> dict[str, str]:
        headers = dict(self._auth)
        if self.kind == "anthropic":
            headers["anthropic-version"] = client_headers.get("anthropic-version",
                                                              _ANTHROPIC_VERSION)
            if "anthropic-beta" in client_headers:
                headers["anthropic-beta"] = client_headers["anthropic-beta"]
        return headers

    async def send(self, endpoint: Endpoint, body: bytes, *,
                   headers: dict[str, str]) -> UpstreamResponse:
        if self._next is None:
            raise NotDispatched(f"provider {self.name} is not started")
        client = next(self._next)
        started = time.perf_counter()
        try:
            request = client.build_request("POST", self._path(endpoint), content=body,
                                           headers=self._headers(headers))
            response = await client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout,
                httpx.UnsupportedProtocol, httpx.LocalProtocolError) as exc:
            # No byte of the request reached the upstream: connect refused, DNS, TLS
            # handshake, pool exhausted, a request httpx refused to write.
            raise NotDispatched(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise DispatchFailed(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            # Not an I/O failure (httpx wraps every one of those): a local error before the
            # request was written (a bad timeout value, a recursion error building it).
            raise NotDispatched(f"{self.name}: local error before sending: "
                                f"{type(exc).__name__}: {exc}") from exc
        return UpstreamResponse(
            status=response.status_code,
            content_type=response.headers.get("content-type", "application/json"),
            chunks=_relay(response, self.name), close=response.aclose,
            elapsed_s=time.perf_counter() - started,
            headers={h: response.headers[h] for h in PASSED_HEADERS if h in response.headers})


async def _relay(response: httpx.Response, name: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_bytes():
            yield chunk
    except httpx.HTTPError as exc:
        raise DispatchFailed(f"{name}: stream broken: {type(exc).__name__}: {exc}") from exc
