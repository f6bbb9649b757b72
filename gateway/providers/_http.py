"""``openai`` and ``anthropic`` provider kinds: one pooled HTTP client per provider.

Bodies go upstream as bytes; the response body is relayed as it arrives (never buffered
for streams). ``accept-encoding: identity`` keeps the relayed bytes equal to what the
usage meter reads.

The client is :mod:`gateway.providers._client` (asyncio protocols and httptools: about
a fifth of httpx's CPU per request, measured by ``tests/bench/speed.py``). When the
environment names an HTTP proxy for the upstream (``HTTPS_PROXY``/``HTTP_PROXY``/
``ALL_PROXY``, minus ``NO_PROXY``), which httpx honours and that client does not, the
provider uses httpx as before: its pool split into a few shards (independent clients,
used round-robin), because httpcore's pool scans every (queued request, connection) pair
on each event, so its cost grows with the square of the concurrency.
"""

from __future__ import annotations

import itertools
import ssl
import time
import urllib.request
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
    ratelimit_of,
    with_trace,
)
from gateway.providers._client import ClientError, HttpClient, Response
from gateway.providers._count import COUNT_PATH, CountFailed, parse_count
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
        self._client: HttpClient | None = None
        self._auth: dict[str, str] = {}

    def speaks(self, protocol: Protocol_) -> bool:
        return protocol == self.kind

    async def start(self) -> None:
        s = self._settings
        if s.api_key_ref:
            secret = resolve_secret(s.api_key_ref, key=f"{self._where}.api_key_ref")
            self._auth = ({"x-api-key": secret} if s.kind == "anthropic"
                          else {"authorization": f"Bearer {secret}"})
        # One TLS context for every connection (httpx's default CA bundle): slow to load.
        tls = ssl.create_default_context(cafile=certifi.where())
        base = (s.base_url or "").rstrip("/")
        if not _proxied(base):
            self._client = HttpClient(
                base, max_connections=s.max_connections, timeout_s=s.timeout_s,
                connect_timeout_s=s.connect_timeout_s, ssl_context=tls,
                headers={"accept-encoding": "identity", "content-type": "application/json"})
            return
        shards = max(1, min(_MAX_SHARDS, s.max_connections // _PER_SHARD))
        per_shard = -(-s.max_connections // shards)
        self._clients = [httpx.AsyncClient(
            base_url=(s.base_url or "").rstrip("/"),
            timeout=httpx.Timeout(s.timeout_s, connect=s.connect_timeout_s), verify=tls,
            limits=httpx.Limits(max_connections=per_shard,
                                max_keepalive_connections=per_shard),
            headers={"accept-encoding": "identity", "content-type": "application/json"})
            for _ in range(shards)]
        self._next = itertools.cycle(self._clients)

    async def close(self) -> None:
        if self._client is not None:
            lean, self._client = self._client, None
            await lean.aclose()
        clients, self._clients, self._next = self._clients, [], None
        for client in clients:
            await client.aclose()

    def _path(self, endpoint: Endpoint) -> str:
        return "/v1/messages" if self.kind == "anthropic" else _OPENAI_PATHS[endpoint]

    def _request(self, endpoint: Endpoint, body: bytes) -> tuple[str, bytes]:
        """The path (below ``base_url``) and the body to send: the body as given here; a
        cloud kind puts the model in the path or rewrites the body
        (``gateway.providers._azure``, ``_vertex``)."""
        return self._path(endpoint), body

    def _headers(self, client_headers: dict[str, str]) -> dict[str, str]:
        headers = dict(self._auth)
        if self.kind == "anthropic":
            headers["anthropic-version"] = client_headers.get("anthropic-version",
                                                              _ANTHROPIC_VERSION)
            if "anthropic-beta" in client_headers:
                headers["anthropic-beta"] = client_headers["anthropic-beta"]
        return with_trace(headers, client_headers)

    async def send(self, endpoint: Endpoint, body: bytes, *,
                   headers: dict[str, str]) -> UpstreamResponse:
        if self._client is not None:
            return await self._send(self._client, endpoint, body, headers)
        if self._next is None:
            raise NotDispatched(f"provider {self.name} is not started")
        client = next(self._next)
        started = time.perf_counter()
        try:
            path, body = self._request(endpoint, body)
            request = client.build_request("POST", path, content=body,
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
            headers={h: response.headers[h] for h in PASSED_HEADERS if h in response.headers},
            ratelimit=ratelimit_of(dict(response.headers)))


    async def _send(self, client: HttpClient, endpoint: Endpoint, body: bytes,
                    headers: dict[str, str]) -> UpstreamResponse:
        started = time.perf_counter()
        try:
            path, body = self._request(endpoint, body)
            response = await client.post(path, body, self._headers(headers))
        except ClientError as exc:
            failure = DispatchFailed if exc.dispatched else NotDispatched
            raise failure(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            # Not an I/O failure: a local error before the request was written.
            raise NotDispatched(f"{self.name}: local error before sending: "
                                f"{type(exc).__name__}: {exc}") from exc
        got = response.headers

        async def close() -> None:
            response.close()
        return UpstreamResponse(
            status=response.status,
            content_type=got.get("content-type", "application/json"),
            chunks=_chunks(response, self.name), close=close,
            elapsed_s=time.perf_counter() - started,
            headers={h: got[h] for h in PASSED_HEADERS if h in got},
            ratelimit=ratelimit_of(got))


    @property
    def counts_tokens(self) -> bool:
        return self.kind == "anthropic"

    def _count_request(self, body: bytes) -> tuple[str, bytes]:
        """The path and body of a token count (Anthropic's; ``_vertex`` has its own)."""
        return COUNT_PATH, body

    async def count_input_tokens(self, body: bytes, *, headers: dict[str, str]) -> int:
        """Anthropic's ``count_tokens`` for ``body`` (``gateway.providers._count``); the
        caller bounds the wait."""
        if not self.counts_tokens:
            raise CountFailed(f"{self.name}: a {self.kind} provider has no token count")
        path, body = self._count_request(body)
        try:
            if self._client is not None:
                response = await self._client.post(path, body, self._headers(headers))
                try:
                    raw = b"".join([chunk async for chunk in response.chunks()])
                finally:
                    response.close()
                return parse_count(response.status, raw, provider=self.name)
            if self._next is None:
                raise CountFailed(f"{self.name}: provider is not started")
            answer = await next(self._next).post(path, content=body,
                                                 headers=self._headers(headers))
            return parse_count(answer.status_code, answer.content, provider=self.name)
        except (ClientError, httpx.HTTPError) as exc:
            raise CountFailed(f"{self.name}: count_tokens: {type(exc).__name__}: "
                              f"{exc}") from exc


def _proxied(url: str) -> bool:
    """Whether the environment sends requests for ``url`` through an HTTP proxy (as
    httpx's ``trust_env`` reads it)."""
    proxies = urllib.request.getproxies()
    scheme = url.split(":", 1)[0].lower()
    if not (proxies.get(scheme) or proxies.get("all")):
        return False
    host = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    return not urllib.request.proxy_bypass(host.split(":")[0] if "]" not in host else host)


async def _chunks(response: Response, name: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.chunks():
            yield chunk
    except ClientError as exc:
        raise DispatchFailed(f"{name}: stream broken: {type(exc).__name__}: {exc}") from exc


async def _relay(response: httpx.Response, name: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_bytes():
            yield chunk
    except httpx.HTTPError as exc:
        raise DispatchFailed(f"{name}: stream broken: {type(exc).__name__}: {exc}") from exc
