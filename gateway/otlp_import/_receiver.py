"""The OTLP/HTTP receiver for agents' own telemetry: ``POST /v1/logs`` and ``/v1/metrics``.

The paths an OTLP/HTTP exporter appends to ``OTEL_EXPORTER_OTLP_ENDPOINT``, so an
agent pointed at the gateway's base URL sends its logs and metrics here. The caller is
authenticated as a generation request is (its gateway key in ``Authorization: Bearer``
or ``x-api-key``: what ``OTEL_EXPORTER_OTLP_HEADERS`` sends), before the body is read;
its usage reports (:mod:`gateway.otlp_import._decode`) are stored for that key's team
and user, each once. Nothing is admitted, charged or settled: no counter moves.

Answers follow the OTLP/HTTP specification: 200 with an ``Export…ServiceResponse`` in
the request's encoding (``partial_success`` counting refused records), and an error as a
``google.rpc.Status`` (protobuf, or its JSON form) with 400 (not an export), 401 (no or a
bad key), 413 (over :data:`MAX_EXPORT_BYTES`, compressed or not), 415 (neither
``application/x-protobuf`` nor ``application/json``), 503 with ``Retry-After`` (the key
store or the report store down: the exporter retries). Bodies may be gzip-compressed.
"""

from __future__ import annotations

import logging
import sqlite3
import zlib
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from litestar import Request, Response, post
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from gateway.errors import InferplaneError, Unauthenticated
from gateway.ingress import Gateway, authenticate
from gateway.otlp_import._decode import BadExport, Decoded, Encoding, decode_logs, decode_metrics
from gateway.otlp_import._store import ReportStore

log = logging.getLogger("mayu.otlp_import")

MAX_EXPORT_BYTES = 4 << 20
"""The largest export accepted, before and after decompression (an agent's batch of a
few hundred events is tens of KB; the OTLP SDKs' default batch is 512 records)."""

AnyRequest = Request[Any, Any, Any]

_GRPC_CODE = {400: 3, 401: 16, 403: 7, 413: 8, 415: 3, 503: 14}
"""HTTP status → google.rpc.Code (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED,
RESOURCE_EXHAUSTED, UNAVAILABLE); anything else is INTERNAL (13)."""


class _Refusal(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def status_body(code: int, message: str, encoding: Encoding) -> bytes:
    """A ``google.rpc.Status`` {code, message}: its two scalar fields encoded directly
    (``code`` field 1 varint, ``message`` field 2 bytes), so no googleapis package is
    needed for one message."""
    if encoding == "json":
        import json

        return json.dumps({"code": code, "message": message}).encode()
    text = message.encode()
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


def _encoding(request: AnyRequest) -> Encoding:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/x-protobuf":
        return "protobuf"
    if kind == "application/json":
        return "json"
    raise _Refusal(415, f"content-type {kind or '(none)'!r}: OTLP/HTTP takes "
                        "application/x-protobuf or application/json")


async def _body(request: AnyRequest) -> bytes:
    """The body, refused with 413 as soon as it (or its gzip inflation) passes
    :data:`MAX_EXPORT_BYTES`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_EXPORT_BYTES:
        raise _Refusal(413, f"export of {declared} bytes exceeds {MAX_EXPORT_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_EXPORT_BYTES:
            raise _Refusal(413, f"export exceeds {MAX_EXPORT_BYTES} bytes")
    coding = request.headers.get("content-encoding", "identity").strip().lower()
    if coding in ("", "identity"):
        return bytes(body)
    if coding != "gzip":
        raise _Refusal(415, f"content-encoding {coding!r}: only gzip is accepted")
    inflate = zlib.decompressobj(wbits=31)
    try:
        out = inflate.decompress(bytes(body), MAX_EXPORT_BYTES + 1)
    except zlib.error as exc:
        raise _Refusal(400, f"gzip body: {exc}") from None
    if len(out) > MAX_EXPORT_BYTES or inflate.unconsumed_tail:
        raise _Refusal(413, f"export inflates past {MAX_EXPORT_BYTES} bytes")
    return out


def _reply(message: Message, encoding: Encoding) -> Response[bytes]:
    if encoding == "json":
        return Response(json_format.MessageToJson(message, indent=None).encode(),
                        media_type="application/json")
    return Response(message.SerializeToString(), media_type="application/x-protobuf")


async def _receive(request: AnyRequest, signal: str) -> Response[bytes]:
    encoding: Encoding = "protobuf"
    try:
        encoding = _encoding(request)
        gw: Gateway = request.app.state.gateway
        who = await authenticate(gw, request)
        body = await _body(request)
        decoded: Decoded = (decode_logs if signal == "logs" else decode_metrics)(body, encoding)
        store: ReportStore = request.app.state.agent_usage
        stored = await store.add(who, decoded.reports)
    except _Refusal as exc:
        return _error(exc.status, exc.message, encoding)
    except BadExport as exc:
        return _error(400, str(exc), encoding)
    except Unauthenticated as exc:
        return _error(401, exc.message, encoding)
    except InferplaneError as exc:
        if exc.status >= 500:
            log.warning("OTLP %s export refused (%d): %s", signal, exc.status, exc.message)
        return _error(exc.status, exc.message, encoding,
                      retry_after=exc.status in (429, 503))
    except sqlite3.Error as exc:  # the local file busy past its timeout, or full
        log.warning("OTLP %s export refused (503): local report store: %s", signal, exc)
        return _error(503, "the report store is unavailable; retry", encoding,
                      retry_after=True)
    gw.audit.write({"event": "agent_usage_import", "signal": signal, "key_id": who.key_id,
                    "team": who.team_id, "reports": len(decoded.reports), "stored": stored,
                    "refused": decoded.refused, "ignored": decoded.ignored})
    return _reply(_response(signal, decoded), encoding)


def _response(signal: str, decoded: Decoded) -> Message:
    note = (f"{decoded.refused} usage record(s) refused: a token count or cost that is "
            "negative, fractional or too large" if decoded.refused else "")
    if signal == "logs":
        logs = ExportLogsServiceResponse()
        if decoded.refused:
            logs.partial_success.rejected_log_records = decoded.refused
            logs.partial_success.error_message = note
        return logs
    metrics = ExportMetricsServiceResponse()
    if decoded.refused:
        metrics.partial_success.rejected_data_points = decoded.refused
        metrics.partial_success.error_message = note
    return metrics


def _error(status: int, message: str, encoding: Encoding, *,
           retry_after: bool = False) -> Response[bytes]:
    return Response(status_body(_GRPC_CODE.get(status, 13), message, encoding),
                    status_code=status,
                    media_type="application/json" if encoding == "json"
                    else "application/x-protobuf",
                    headers={"Retry-After": "1"} if retry_after else None)


@post("/v1/logs", summary="OTLP/HTTP logs: an agent's own usage events (never billed)",
      include_in_schema=False, status_code=200)
async def receive_logs(request: AnyRequest) -> Response[bytes]:
    """Claude Code's ``claude_code.api_request`` and Codex's ``codex.sse_event``."""
    return await _receive(request, "logs")


@post("/v1/metrics", summary="OTLP/HTTP metrics: an agent's own usage counters (never billed)",
      include_in_schema=False, status_code=200)
async def receive_metrics(request: AnyRequest) -> Response[bytes]:
    """Claude Code's ``claude_code.token.usage`` and ``claude_code.cost.usage``."""
    return await _receive(request, "metrics")


ROUTES = [receive_logs, receive_metrics]
