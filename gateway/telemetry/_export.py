"""Spans leave on a thread of their own, through a bounded queue that never blocks.

:class:`BoundedExport` is the span processor: a finished span is appended to a queue of
at most ``queue_size`` spans and the request goes on; a thread sends them in batches
(every ``batch_delay_s``, sooner when a batch is full), each export bounded by
``export_timeout_s``. A span that finds the queue full, or whose batch the collector did
not take (down, hanging, refusing), is dropped and counted in
``mayu_telemetry_dropped_spans_total`` — a request never waits on the collector.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client import Counter

log = logging.getLogger("mayu.telemetry")

BATCH = 512
"""Spans per export request at most."""


class BoundedExport(SpanProcessor):
    """The bounded queue and its export thread (module docstring)."""

    def __init__(self, exporter: SpanExporter, *, queue_size: int, delay_s: float,
                 dropped: Counter, exported: Counter) -> None:
        self._exporter = exporter
        self._size = queue_size
        self._delay = delay_s
        self._spans: collections.deque[ReadableSpan] = collections.deque()
        self._dropped = dropped
        self._exported = exported
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._failing = False
        self.dropped_count = 0
        """Spans dropped by this process (what the counter adds, readable in one place)."""
        self._thread = threading.Thread(target=self._run, name="mayu-otlp-spans",
                                        daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        if len(self._spans) >= self._size or self._stopping.is_set():
            self._drop(1)
            return
        self._spans.append(span)  # deque appends are atomic: no lock on the request path
        if len(self._spans) >= BATCH:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._delay)
            self._wake.clear()
            while self._spans and not self._stopping.is_set():
                self._export(self._batch())
        # Stopping: one more export at most (a hung collector costs one deadline, not one
        # per batch); what is left is dropped and counted.
        if self._spans:
            self._export(self._batch())
        self._drop(len(self._spans))
        self._spans.clear()

    def _batch(self) -> list[ReadableSpan]:
        return [self._spans.popleft() for _ in range(min(BATCH, len(self._spans)))]

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        try:
            result = self._exporter.export(batch)
        except Exception as exc:  # the exporter's own bug must not end the thread
            log.warning("telemetry: span export raised %s", type(exc).__name__)
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self._exported.inc(len(batch))
            if self._failing:
                log.info("telemetry: span export works again")
            self._failing = False
            return
        self._drop(len(batch))
        if not self._failing:  # once per outage, not per batch
            log.warning("telemetry: span export failed; %d spans dropped (counted in "
                        "mayu_telemetry_dropped_spans_total)", len(batch))
        self._failing = True

    def _drop(self, n: int) -> None:
        self.dropped_count += n
        self._dropped.inc(n)

    def shutdown(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._thread.join()
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait (at most ``timeout_millis``) for the queue to be sent."""
        end = time.monotonic() + timeout_millis / 1000
        self._wake.set()
        while self._spans and time.monotonic() < end:
            time.sleep(0.01)
        return not self._spans


def counters(registry: Any) -> tuple[Counter, Counter]:
    """The dropped and exported span counters, in the gateway's Prometheus registry."""
    dropped = Counter("mayu_telemetry_dropped_spans", "Spans not exported: the queue was "
                      "full (telemetry.queue_size) or the collector did not take their "
                      "batch.", registry=registry)
    exported = Counter("mayu_telemetry_exported_spans", "Spans the collector took.",
                       registry=registry)
    return dropped, exported
