"""The ``telemetry:`` block of the gateway settings (docs/telemetry.md).

Absent: nothing is traced or exported and no OpenTelemetry module is imported. Present:
spans per request and the Prometheus figures, both over OTLP/HTTP to ``endpoint`` (the
``inferplane[otel]`` extra must be installed; startup says so, naming the key).
Header values that are secrets (a collector's API key) go in ``header_refs`` as
``env:NAME`` / ``file:PATH`` references, never inline.
"""

from __future__ import annotations

from typing import Annotated

import msgspec


class _Base(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class TelemetrySettings(_Base, frozen=True):
    endpoint: Annotated[str, msgspec.Meta(pattern=r"^https?://[^/?#\s]+(/[^?#\s]*)?$")]
    """The collector's OTLP/HTTP base URL (``http://collector:4318``): spans go to
    ``{endpoint}/v1/traces``, metrics to ``{endpoint}/v1/metrics``."""
    headers: dict[str, str] = {}
    """Plain headers sent with every export (no secrets: use ``header_refs``)."""
    header_refs: dict[str, str] = {}
    """Header name → ``env:NAME`` or ``file:PATH`` reference, resolved at startup."""
    service_name: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] = "inferplane"
    sample_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 1.0
    """Share of new traces sampled; a client's ``traceparent`` decides for its own."""
    capture_content: bool = False
    """Export the request's messages (``gen_ai.input.messages``); off: no prompt text."""
    queue_size: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 2048
    """Spans held for export at most; past it they are dropped and counted."""
    export_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=60)] = 2.0
    """One export's deadline (a hung collector costs the export thread this, no request)."""
    batch_delay_s: Annotated[float, msgspec.Meta(gt=0, le=60)] = 1.0
    """How often queued spans are sent (sooner when a batch of 512 is ready)."""
    traces: bool = True
    metrics: bool = True
    metrics_interval_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 30.0
    """How often the metrics are exported."""
