"""The ``bedrock`` provider kind: Anthropic Messages on Amazon Bedrock's runtime API.

A Messages body becomes an ``InvokeModel`` (``POST /model/{modelId}/invoke``) or, with
``stream: true``, an ``InvokeModelWithResponseStream``
(``/model/{modelId}/invoke-with-response-stream``) request, as Bedrock's Claude documents
it (https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages.html):
``model`` leaves the body for the path (a model id or an inference profile id such as
``us.anthropic.claude-sonnet-4-5-20250929-v1:0``), ``stream`` is dropped, the body carries
``anthropic_version: bedrock-2023-05-31`` and the client's ``anthropic-beta`` header as
``anthropic_beta``. Each request is signed with botocore's SigV4 signer (``SigV4Auth``
on an ``AWSRequest``) with the provider's current credentials
(:mod:`gateway.providers._credentials`).

The answer goes back in Anthropic's own shape, so every ingress, meter and settlement
treats a Bedrock deployment as an ``anthropic`` one: a JSON answer is Anthropic's
message already; a stream's event-stream messages are decoded as they arrive (botocore's
decoder) and each ``chunk`` is relayed at once as its SSE event. The usage is the
events' own (``message_start`` and ``message_delta``); ``amazon-bedrock-invocationMetrics``
on ``message_stop`` is checked against it (a disagreement is logged). Bedrock's errors
(``{"message"}`` with the ``x-amzn-errortype`` header) become Anthropic's error body with
a status whose retryability is Bedrock's: throttling and ``ModelNotReady`` are 429,
service unavailable 503, timeouts 408 (all retried on the next deployment); validation
400; the gateway's own credentials refused (403/``ExpiredToken``) a 500 (a definite
answer, unlike a proxy's 502: nothing ran, nothing is charged; the next deployment is
tried); credentials the
gateway could not get a 503 sent without calling Bedrock. An exception
message mid-stream ends the stream as a cut (what arrived commits, the rest is liability).

It counts input tokens with Bedrock's ``CountTokens`` (``POST /model/{id}/count-tokens``
with the InvokeModel body, base64, under ``input.invokeModel.body``; the answer's
``inputTokens``), so a Bedrock deployment's input bound is refined as an Anthropic one's
(docs/bounds.md). The count names the foundation model, not an inference profile
(``us.anthropic.…`` is counted as ``anthropic.…``): profiles are not accepted there.
"""

from __future__ import annotations

import base64
import logging
import re
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import certifi
import msgspec

from gateway.config import AwsCredentials, ProviderSettings
from gateway.providers._base import (
    PASSED_HEADERS,
    DispatchFailed,
    NotDispatched,
    Protocol_,
    UpstreamResponse,
    with_trace,
)
from gateway.providers._client import ClientError, HttpClient, Response
from gateway.providers._count import CountFailed
from gateway.providers._credentials import (
    AwsSource,
    CredentialsUnavailable,
    unavailable_response,
)
from gateway.providers._eventstream import Decoder, chunk_bytes, message_headers, sse_event
from gateway.providers._http import _chunks
from gateway.usage import Endpoint

log = logging.getLogger("mayu.providers.bedrock")

BEDROCK_VERSION = "bedrock-2023-05-31"
_SIGNING_NAME = "bedrock"
_PROFILE = re.compile(r"^(?:us|eu|apac|jp|au|ca|us-gov|global)\.")

# Bedrock's error type → (status the client gets, Anthropic error type).
ERRORS: dict[str, tuple[int, str]] = {
    "ThrottlingException": (429, "rate_limit_error"),
    "ModelNotReadyException": (429, "rate_limit_error"),
    "ServiceQuotaExceededException": (429, "rate_limit_error"),
    "ServiceUnavailableException": (503, "overloaded_error"),
    "InternalServerException": (500, "api_error"),
    "ModelTimeoutException": (408, "timeout_error"),
    "ModelErrorException": (500, "api_error"),
    "ValidationException": (400, "invalid_request_error"),
    "ResourceNotFoundException": (404, "not_found_error"),
    "AccessDeniedException": (500, "api_error"),
    "UnrecognizedClientException": (500, "api_error"),
    "ExpiredTokenException": (500, "api_error"),
    "InvalidSignatureException": (500, "api_error"),
}
_GATEWAY_SIDE = frozenset({"AccessDeniedException", "UnrecognizedClientException",
                           "ExpiredTokenException", "InvalidSignatureException"})


def error_type(raw: str | None) -> str:
    """``ThrottlingException`` from ``ThrottlingException:http://internal...`` (the
    header) or ``throttlingException`` (a stream's ``:exception-type``)."""
    name = (raw or "").split(":", 1)[0].strip()
    return name[:1].upper() + name[1:] if name else "InternalServerException"


def anthropic_error(kind: str, message: str, status: int) -> tuple[int, bytes]:
    """A Bedrock error as the status and body an Anthropic client expects."""
    mapped_status, mapped = ERRORS.get(kind, (status if status >= 400 else 500, "api_error"))
    if kind in _GATEWAY_SIDE:
        # Bedrock's text for these can quote the canonical request it computed, signed
        # headers and all (the session token among them): it stays out of the answer,
        # the audit and the log; its first line says what was wrong.
        log.warning("Bedrock refused the gateway's credentials: %s: %s", kind,
                    message.split("\n", 1)[0][:200])
        text = f"Bedrock refused the gateway's credentials ({kind}); see the gateway log"
    else:
        text = f"{kind}: {message}"
    body = {"type": "error", "error": {"type": mapped, "message": text}}
    return mapped_status, msgspec.json.encode(body)


def bedrock_body(body: bytes, client_headers: dict[str, str]) -> tuple[str, bool, bytes]:
    """(model id, stream, Bedrock body) of an Anthropic Messages body."""
    doc: dict[str, Any] = msgspec.json.decode(body)
    model = doc.pop("model", None)
    if not isinstance(model, str) or not model:
        raise NotDispatched("bedrock: the body names no model")
    stream = doc.pop("stream", False) is True
    doc["anthropic_version"] = BEDROCK_VERSION
    betas = [b.strip() for b in client_headers.get("anthropic-beta", "").split(",")
             if b.strip()]
    if betas:
        known = doc.get("anthropic_beta")
        doc["anthropic_beta"] = [*(known if isinstance(known, list) else []),
                                 *[b for b in betas if not (isinstance(known, list)
                                                            and b in known)]]
    return model, stream, msgspec.json.encode(doc)


class BedrockProvider:
    """A ``bedrock`` provider: one pooled HTTP client, one AWS credential source."""

    def __init__(self, settings: ProviderSettings, *, index: int = 0) -> None:
        creds = settings.credentials
        assert isinstance(creds, AwsCredentials)  # the config check says so
        self.name = settings.name
        self.kind = "bedrock"
        self._settings = settings
        self.region = creds.region
        self.base_url = (settings.base_url
                         or f"https://bedrock-runtime.{creds.region}.amazonaws.com").rstrip("/")
        self.credentials = AwsSource(creds, provider=settings.name,
                                     where=f"providers[{index}]")
        self._client: HttpClient | None = None

    def speaks(self, protocol: Protocol_) -> bool:
        return protocol == "anthropic"

    async def start(self) -> None:
        s = self._settings
        self._client = HttpClient(
            self.base_url, max_connections=s.max_connections, timeout_s=s.timeout_s,
            connect_timeout_s=s.connect_timeout_s,
            ssl_context=ssl.create_default_context(cafile=certifi.where()),
            headers={"accept-encoding": "identity"})
        await self.credentials.start()

    async def close(self) -> None:
        await self.credentials.close()
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    def signed(self, path: str, body: bytes, *, stream: bool) -> dict[str, str]:
        """The headers of one request signed with SigV4 (botocore's signer)."""
        from botocore.auth import SigV4Auth  # botocore loads with a Bedrock deployment's
        from botocore.awsrequest import AWSRequest  # first request, not at startup
        request = AWSRequest(method="POST", url=self.base_url + path, data=body,
                             headers={"content-type": "application/json",
                                      "accept": ("application/vnd.amazon.eventstream"
                                                 if stream else "application/json")})
        SigV4Auth(self.credentials.current(), _SIGNING_NAME, self.region).add_auth(request)
        return {k.lower(): v for k, v in request.headers.items()}

    async def send(self, endpoint: Endpoint, body: bytes, *,
                   headers: dict[str, str]) -> UpstreamResponse:
        if self._client is None:
            raise NotDispatched(f"provider {self.name} is not started")
        started = time.perf_counter()
        try:
            model, stream, payload = bedrock_body(body, headers)
            path = (f"/model/{quote(model, safe='')}/"
                    f"{'invoke-with-response-stream' if stream else 'invoke'}")
            signed = self.signed(path, payload, stream=stream)
        except CredentialsUnavailable as exc:
            return unavailable_response(exc, provider=self.name)
        except NotDispatched:
            raise
        except Exception as exc:  # a local error before anything was sent
            raise NotDispatched(f"{self.name}: local error before sending: "
                                f"{type(exc).__name__}: {exc}") from exc
        try:
            # The trace context (when traced) goes unsigned: SigV4 signs what it lists.
            response = await self._client.post(path, payload, with_trace(signed, headers))
        except ClientError as exc:
            failure = DispatchFailed if exc.dispatched else NotDispatched
            raise failure(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        got = response.headers
        passed = {h: got[h] for h in PASSED_HEADERS if h in got}
        if "x-amzn-requestid" in got:
            passed["request-id"] = got["x-amzn-requestid"]
        elapsed = time.perf_counter() - started

        async def close() -> None:
            response.close()
        if response.status != 200:
            raw = b"".join([c async for c in _chunks(response, self.name)])
            response.close()
            status, answer = anthropic_error(error_type(got.get("x-amzn-errortype")),
                                             _message(raw), response.status)
            return UpstreamResponse(status=status, content_type="application/json",
                                    chunks=_once(answer), elapsed_s=elapsed, headers=passed)
        if not stream:
            return UpstreamResponse(status=200, content_type="application/json",
                                    chunks=_chunks(response, self.name), close=close,
                                    elapsed_s=elapsed, headers=passed)
        return UpstreamResponse(status=200, content_type="text/event-stream",
                                chunks=_events(response, self.name), close=close,
                                elapsed_s=elapsed, headers=passed)


    @property
    def counts_tokens(self) -> bool:
        return True

    async def count_input_tokens(self, body: bytes, *, headers: dict[str, str]) -> int:
        """Bedrock's ``CountTokens`` for a ``count_body`` (module docstring); the caller
        bounds the wait. Any failure is a CountFailed (the byte bound stands)."""
        if self._client is None:
            raise CountFailed(f"{self.name}: provider is not started")
        try:
            model, _, invoke = bedrock_body(body, headers)
            # The InvokeModel body must be one Bedrock would run: it requires max_tokens.
            invoke = msgspec.json.encode({**msgspec.json.decode(invoke), "max_tokens": 1})
            payload = msgspec.json.encode(
                {"input": {"invokeModel": {"body": base64.b64encode(invoke).decode()}}})
            path = f"/model/{quote(_PROFILE.sub('', model), safe='')}/count-tokens"
            response = await self._client.post(path, payload,
                                               self.signed(path, payload, stream=False))
            try:
                raw = b"".join([chunk async for chunk in response.chunks()])
            finally:
                response.close()
        except (ClientError, NotDispatched) as exc:
            raise CountFailed(f"{self.name}: CountTokens: {type(exc).__name__}: "
                              f"{exc}") from exc
        if response.status != 200:
            raise CountFailed(f"{self.name}: CountTokens answered HTTP {response.status} "
                              f"({error_type(response.headers.get('x-amzn-errortype'))})")
        try:
            value = msgspec.json.decode(raw).get("inputTokens")
        except (msgspec.DecodeError, AttributeError) as exc:
            raise CountFailed(f"{self.name}: CountTokens answer is not a JSON object") from exc
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CountFailed(f"{self.name}: CountTokens answer has no valid inputTokens")
        return value


def _message(raw: bytes) -> str:
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return raw[:200].decode("utf-8", "replace")
    text = doc.get("message") or doc.get("Message") if isinstance(doc, dict) else None
    return str(text) if text else "(no message)"


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def _events(response: Response, name: str) -> AsyncIterator[bytes]:
    """The event stream as Anthropic SSE, each event relayed as it is decoded."""
    from botocore.eventstream import (
        ChecksumMismatch,
        InvalidHeadersLength,
        InvalidPayloadLength,
    )
    decoder = Decoder()
    output = 0
    async for data in _chunks(response, name):
        out: list[bytes] = []
        failure: DispatchFailed | None = None
        try:
            for message in decoder.feed(data):
                event = chunk_bytes(message)
                if event is None:
                    kind = message_headers(message).get(":exception-type") or "unknown"
                    failure = DispatchFailed(f"{name}: Bedrock stream exception {kind}: "
                                             f"{_message(message.payload)}")
                    break
                output = _check_metrics(event, output, name)
                out.append(sse_event(event))
        except (ChecksumMismatch, InvalidHeadersLength, InvalidPayloadLength) as exc:
            failure = DispatchFailed(f"{name}: bad event-stream framing: {exc}")
        if out:  # the events before an exception in the same read still count
            yield b"".join(out)
        if failure is not None:
            raise failure


def _check_metrics(event: bytes, output: int, name: str) -> int:
    """Track the events' output count; compare it with Bedrock's invocation metrics."""
    if b'"message_delta"' in event:
        usage = msgspec.json.decode(event).get("usage") or {}
        return int(usage.get("output_tokens", output))
    if b"amazon-bedrock-invocationMetrics" in event:
        metrics = msgspec.json.decode(event).get("amazon-bedrock-invocationMetrics") or {}
        reported = metrics.get("outputTokenCount")
        if isinstance(reported, int) and reported != output:
            log.warning("provider %s: invocation metrics report %d output tokens, the "
                        "events %d", name, reported, output)
    return output
