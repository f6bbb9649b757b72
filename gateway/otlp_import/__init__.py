"""The agents' own usage reports: an OTLP/HTTP receiver beside the gateway's request log.

Claude Code and Codex export what they used over OTLP; pointed at the gateway
(``OTEL_EXPORTER_OTLP_ENDPOINT`` = its base URL, the key in
``OTEL_EXPORTER_OTLP_HEADERS``: docs/telemetry.md) they reach :data:`ROUTES`
(``POST /v1/logs``, ``/v1/metrics``: :mod:`._receiver`), whose usage records
(:mod:`._decode`) are stored once each for the key's team and user (:mod:`._store`),
never billed, and summed by the usage API beside what the gateway committed
(``GET /admin/v1/agent-usage``; a large gap is traffic that bypassed the gateway); kept
as long as the request log (:mod:`._retention`).
"""

from gateway.otlp_import._decode import (
    BadExport,
    ClientReport,
    Decoded,
    decode_logs,
    decode_metrics,
)
from gateway.otlp_import._receiver import MAX_EXPORT_BYTES, ROUTES
from gateway.otlp_import._retention import prune_reports_forever, report_cutoff
from gateway.otlp_import._store import (
    PostgresReportStore,
    ReportedFigures,
    ReportFilter,
    ReportGroup,
    ReportStore,
    SqliteReportStore,
)

__all__ = ["MAX_EXPORT_BYTES", "ROUTES", "BadExport", "ClientReport", "Decoded",
           "PostgresReportStore", "ReportFilter", "ReportGroup", "ReportStore",
           "ReportedFigures", "SqliteReportStore", "decode_logs", "decode_metrics",
           "prune_reports_forever", "report_cutoff"]
