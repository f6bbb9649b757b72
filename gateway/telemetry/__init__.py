"""OpenTelemetry for the gateway (issue 40, docs/telemetry.md): GenAI spans per request
and the Prometheus figures over OTLP/HTTP, both off unless ``telemetry:`` is configured.

The request path only ever sees :class:`RequestTrace` (:data:`OFF` when tracing is off);
the OpenTelemetry SDK is imported by :func:`start_telemetry`, and only when configured.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gateway.errors import ConfigError
from gateway.telemetry._semconv import (
    SEMCONV_VERSION,
    error_type,
    operation_name,
    principal_attributes,
    provider_name,
    server_attributes,
    settlement_attributes,
    span_name,
    usage_attributes,
)
from gateway.telemetry._settings import TelemetrySettings
from gateway.telemetry._trace import (
    NO_SPAN,
    OFF,
    TELEMETRY_OFF,
    RequestTrace,
    Span,
    Telemetry,
)

__all__ = ["NO_SPAN", "OFF", "SEMCONV_VERSION", "TELEMETRY_OFF", "RequestTrace", "Span",
           "Telemetry", "TelemetrySettings", "error_type", "operation_name",
           "principal_attributes", "provider_name", "server_attributes",
           "settlement_attributes", "span_name", "start_telemetry", "usage_attributes"]

INSTALL_HINT = "pip install 'inferplane[otel]'"


def start_telemetry(settings: TelemetrySettings | None, *, registry: Any,
                    headers: Mapping[str, str] = {}, instance: str = "",
                    providers: Mapping[str, tuple[str, str | None]] = {},
                    refresh: Any = None) -> Telemetry:
    """The process's telemetry: :data:`TELEMETRY_OFF` without settings; else spans (and
    the registry's metrics) exported to ``settings.endpoint``. ``headers``: the resolved
    export headers (``headers`` and ``header_refs``); ``providers``: each configured
    provider's (kind, base URL); ``refresh``: the cluster figures' refresh (shared profile).
    Raises :class:`ConfigError` naming the key when the extra is not installed."""
    if settings is None:
        return TELEMETRY_OFF
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        from gateway.telemetry._bridge import MetricsExport
        from gateway.telemetry._export import BoundedExport, counters
        from gateway.telemetry._otel import OtelTelemetry, tracer_provider
    except ImportError as exc:
        raise ConfigError(f"telemetry: the OpenTelemetry packages are not installed "
                          f"({exc.name}); {INSTALL_HINT}") from exc
    endpoint = settings.endpoint.rstrip("/")
    instance = instance or f"{os.uname().nodename}:{os.getpid()}"
    provider = tracer_provider(service=settings.service_name, instance=instance,
                               ratio=settings.sample_ratio)
    dropped, exported = counters(registry)
    export = None
    if settings.traces:
        exporter = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", headers=dict(headers),
                                    timeout=settings.export_timeout_s)
        export = BoundedExport(exporter, queue_size=settings.queue_size,
                               delay_s=settings.batch_delay_s, dropped=dropped,
                               exported=exported)
        provider.add_span_processor(export)
    metrics = None
    if settings.metrics:
        metrics = MetricsExport(registry, endpoint=endpoint, headers=dict(headers),
                                timeout_s=settings.export_timeout_s,
                                interval_s=settings.metrics_interval_s,
                                resource=provider.resource, refresh=refresh)
    return OtelTelemetry(provider, capture_content=settings.capture_content,
                         providers=providers, export=export, metrics=metrics)
