"""A real OTLP/HTTP receiver, run as its own process by tests (``tests/e2e/_otlp.py``).

    python -m tests.e2e.otlp_receiver --port PORT --out DIR [--hang]

It answers ``POST /v1/traces``, ``/v1/metrics`` and ``/v1/logs`` as a collector does,
decoding the real protobuf messages (``opentelemetry-proto``'s
``ExportTraceServiceRequest``, ``ExportMetricsServiceRequest``,
``ExportLogsServiceRequest``; gzip or not; OTLP/JSON too), and appends to ``DIR``:

- ``spans.jsonl``: one span a line — ``trace_id``, ``span_id``, ``parent_span_id`` (hex),
  ``name``, ``kind``, ``attributes`` (a flat dict), ``events``, ``status``,
  ``resource`` (its attributes), ``scope``, ``start_ns`` / ``end_ns``;
- ``metrics.jsonl``: one data point a line — ``name``, ``type`` (sum, gauge, histogram),
  ``attributes``, ``value`` (an int or a float; histograms: ``count``/``sum``),
  ``resource``, ``time_ns``;
- ``logs.jsonl``: one log record a line — ``body``, ``attributes``, ``event_name``,
  ``resource``, ``time_ns``;
- ``raw.jsonl``: every request as decoded, whole (``{"path": ..., "request": ...}``), so
  a test can search everything that arrived;
- ``headers.jsonl``: each request's path and headers.

``GET /ready`` answers 200. With ``--hang`` it accepts connections and never answers
(a collector that hangs). Lines are written under a lock and flushed per request.
"""

from __future__ import annotations

import argparse
import gzip
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict, Parse
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tests.e2e._http import QuietHandler

SIGNALS: dict[str, tuple[type[Message], type[Message]]] = {
    "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
    "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
    "/v1/logs": (ExportLogsServiceRequest, ExportLogsServiceResponse),
}


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


def _records(resources: Any, scoped: str, items: str) -> Iterator[tuple[dict[str, Any], Any, Any]]:
    """(resource attributes, scope, item) of every item of an export request's
    ``resources``, each of which holds its ``scoped`` lists of ``items``."""
    for r in resources:
        resource = attributes(r.resource.attributes)
        for group in getattr(r, scoped):
            for item in getattr(group, items):
                yield resource, group.scope, item


def spans(req: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    return [{"trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
             "parent_span_id": s.parent_span_id.hex(), "name": s.name,
             "kind": s.kind, "attributes": attributes(s.attributes),
             "events": [{"name": e.name, "attributes": attributes(e.attributes)}
                        for e in s.events],
             "status": {"code": s.status.code, "message": s.status.message},
             "resource": resource, "scope": scope.name,
             "start_ns": s.start_time_unix_nano, "end_ns": s.end_time_unix_nano}
            for resource, scope, s in _records(req.resource_spans, "scope_spans", "spans")]


def _point(p: Any) -> Any:
    kind = p.WhichOneof("value")
    return getattr(p, kind) if kind else None


def metrics(req: ExportMetricsServiceRequest) -> list[dict[str, Any]]:
    out = []
    for resource, _, m in _records(req.resource_metrics, "scope_metrics", "metrics"):
        kind = m.WhichOneof("data")
        for p in getattr(m, kind).data_points:
            row: dict[str, Any] = {"name": m.name, "type": kind,
                                   "attributes": attributes(p.attributes),
                                   "resource": resource, "time_ns": p.time_unix_nano}
            if kind in ("sum", "gauge"):
                row["value"] = _point(p)
            else:
                row["count"], row["sum"] = p.count, p.sum
            out.append(row)
    return out


def logs(req: ExportLogsServiceRequest) -> list[dict[str, Any]]:
    return [{"body": value(r.body), "attributes": attributes(r.attributes),
             "event_name": r.event_name, "resource": resource, "time_ns": r.time_unix_nano}
            for resource, _, r in _records(req.resource_logs, "scope_logs", "log_records")]


class Store:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.lock = threading.Lock()

    def write(self, name: str, rows: list[dict[str, Any]]) -> None:
        with self.lock, (self.out / name).open("a") as f:
            for row in rows:
                f.write(json.dumps(row, default=str) + "\n")


def handler(store: Store, hang: threading.Event | None) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send(200 if self.path == "/ready" else 404, "text/plain", b"ok")

        def do_POST(self) -> None:
            if hang is not None:
                hang.wait()  # never set: the client times out
                return
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.headers.get("content-encoding", "") == "gzip":
                body = gzip.decompress(body)
            signal = SIGNALS.get(self.path)
            if signal is None:
                self.send(404, "text/plain", b"")
                return
            request_type, response_type = signal
            request = request_type()
            as_json = self.headers.get("content-type", "").startswith("application/json")
            try:
                if as_json:
                    Parse(body.decode(), request)
                else:
                    request.ParseFromString(body)
            except Exception as exc:
                self.send(400, "text/plain", str(exc).encode())
                return
            store.write("headers.jsonl", [{"path": self.path, "headers": dict(self.headers)}])
            store.write("raw.jsonl", [{"path": self.path, "request": MessageToDict(request)}])
            rows = {"/v1/traces": spans, "/v1/metrics": metrics, "/v1/logs": logs}[self.path]
            store.write(f"{self.path.rsplit('/', 1)[1].replace('traces', 'spans')}.jsonl",
                        rows(request))  # type: ignore[operator]
            self.send(200, "application/x-protobuf", response_type().SerializeToString())

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hang", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", args.port),
                                 handler(Store(args.out), threading.Event() if args.hang
                                         else None))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
