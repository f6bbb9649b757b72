"""The Prometheus figures over OTLP: a bridge from the gateway's own registry.

Every family of the registry ``/metrics`` serves becomes an OpenTelemetry observable
instrument of the same name, labels and value, read from the registry when the metrics
are exported (every ``telemetry.metrics_interval_s``): counters as cumulative monotonic
sums (``mayu_committed_micro_usd_total``), gauges as gauges (``mayu_cluster_*``),
histograms as their ``_count`` and ``_sum`` (the buckets stay Prometheus's). One source,
so the two can never disagree: what a scrape would read at that moment is what leaves.
The shared profile's cluster figures are refreshed for the export as a scrape refreshes
them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from gateway.tasks import cancel_and_wait

log = logging.getLogger("mayu.telemetry")

_FRESH_S = 0.5
"""One registry read serves every instrument of one export."""


class _Snapshot:
    """The registry's samples by name, read at most once per export."""

    def __init__(self, registry: Any) -> None:
        self._registry = registry
        self._read_at = -1.0
        self._samples: dict[str, list[Observation]] = {}

    def _read(self) -> None:
        samples: dict[str, list[Observation]] = {}
        for family in self._registry.collect():
            for s in family.samples:
                value = s.value
                if isinstance(value, float) and value.is_integer():
                    value = int(value)  # µUSD and counts stay integers on the wire
                samples.setdefault(s.name, []).append(Observation(value, dict(s.labels)))
        self._samples, self._read_at = samples, time.monotonic()

    def reader(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            if time.monotonic() - self._read_at > _FRESH_S:
                self._read()
            return list(self._samples.get(name, ()))
        return observe


def _instruments(meter: Any, registry: Any) -> int:
    """One observable instrument per sample series name; returns how many."""
    snapshot = _Snapshot(registry)
    made = 0
    for family in registry.collect():
        doc, name = family.documentation, family.name
        if family.type == "counter":
            meter.create_observable_counter(f"{name}_total", [snapshot.reader(f"{name}_total")],
                                            description=doc)
            made += 1
        elif family.type == "gauge":
            meter.create_observable_gauge(name, [snapshot.reader(name)], description=doc)
            made += 1
        elif family.type in ("histogram", "summary"):
            for part in ("_count", "_sum"):
                meter.create_observable_counter(f"{name}{part}", [snapshot.reader(f"{name}{part}")],
                                                description=doc)
                made += 1
    return made


class MetricsExport:
    """The meter provider exporting the bridged registry, and the cluster refresher."""

    def __init__(self, registry: Any, *, endpoint: str, headers: dict[str, str],
                 timeout_s: float, interval_s: float, resource: Resource,
                 refresh: Callable[[], Any] | None = None) -> None:
        exporter = OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics", headers=headers,
                                      timeout=timeout_s)
        reader = PeriodicExportingMetricReader(
            exporter, export_interval_millis=interval_s * 1000,
            export_timeout_millis=timeout_s * 1000)
        self._provider = MeterProvider(resource=resource, metric_readers=[reader])
        self.instruments = _instruments(self._provider.get_meter("inferplane"), registry)
        self._refresher: asyncio.Task[None] | None = None
        if refresh is not None:
            self._refresher = asyncio.get_running_loop().create_task(
                self._refresh(refresh, interval_s))

    @staticmethod
    async def _refresh(refresh: Callable[[], Any], interval_s: float) -> None:
        while True:
            await refresh()  # cached and failure-tolerant (gateway.cluster_metrics)
            await asyncio.sleep(interval_s / 2)

    async def aclose(self) -> None:
        await cancel_and_wait(self._refresher)
        await asyncio.to_thread(self._provider.shutdown)
