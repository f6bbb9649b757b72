"""What an agent's OTLP export says it used: Claude Code's and Codex's usage, as reports.

An export (``ExportLogsServiceRequest`` / ``ExportMetricsServiceRequest``, protobuf or
OTLP/JSON) is decoded with the ``opentelemetry-proto`` messages and each record that
carries usage becomes one :class:`ClientReport`; everything else in the export (prompts,
tool decisions, other metrics) is counted as ignored and dropped, never stored.

Recognized (names checked against Claude Code 2.1.197's real export and the public
Claude Code "Monitoring usage" and Codex OTel docs):

- Claude Code log event ``claude_code.api_request`` (``event.name`` = ``api_request``):
  ``input_tokens``, ``output_tokens``, ``cache_read_tokens``, ``cache_creation_tokens``,
  ``cost_usd_micros`` (else ``cost_usd``), ``model``, ``session.id``, ``prompt.id``,
  ``event.sequence``, ``event.timestamp``. Its id is the sha256 of (``session.id``,
  ``prompt.id``, ``event.sequence``): the sequence counts the events of one process and
  restarts with the next one (``claude -p --continue`` keeps the session), and a prompt id
  is new per prompt, so the three together name one event however often it is exported.
- Claude Code metrics ``claude_code.token.usage`` (``type`` = ``input``, ``output``,
  ``cacheRead``, ``cacheCreation``) and ``claude_code.cost.usage`` (USD), delta data
  points only (Claude Code's default temporality; a cumulative point would count a
  session again at every export, so it is ignored): the points of one session, model and
  interval become one report, id'd by those. The usage API uses them only for a session
  whose log events it has none of (both say the same thing).
- Codex log event ``codex.sse_event`` of kind ``response.completed`` that carries counts
  (Codex 0.171.0 sends one without, then one with): ``input_token_count`` (cached
  tokens included, OpenAI's way), ``cached_token_count``, ``cache_write_token_count``
  (taken as part of the input too, like the cached ones), ``output_token_count``,
  ``model``, ``conversation.id``. Stored as uncached input, cache reads and cache writes,
  the classes the gateway's request log uses. No id in the record, so its id is the
  sha256 of the record's deterministic serialization: a replayed export is the same
  bytes.

Counts are refused, not clamped, when negative, fractional or above
:data:`gateway.ceilings.MAX_TOKENS_PER_CLASS`: a clamped figure would be one the agent
never reported. A refused record is counted (the export's ``partial_success``), never
stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any, Literal

import msgspec
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from gateway.ceilings import MAX_AMOUNT, MAX_TOKENS_PER_CLASS

Signal = Literal["event", "metric"]
Encoding = Literal["protobuf", "json"]


class BadExport(ValueError):
    """The body is not an OTLP export of the signal its path names."""


class ClientReport(msgspec.Struct, frozen=True, kw_only=True):
    """One usage event an agent reported about itself (never billed)."""

    event_id: str
    agent: str
    """``claude-code``, ``codex``, else the exporter's ``service.name``."""
    signal: Signal
    session_id: str | None
    model: str | None
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reported_cost_uusd: int | None
    """The agent's own cost estimate in µUSD (None: it reported none)."""
    reported_at: datetime

    @property
    def tokens(self) -> int:
        return (self.input_tokens + self.output_tokens + self.cache_read_tokens
                + self.cache_write_tokens)


class Decoded(msgspec.Struct, frozen=True, kw_only=True):
    """An export's usage reports, and how many of its records carried none."""

    reports: list[ClientReport]
    ignored: int = 0
    """Records with no usage (prompts, tool decisions, other metrics) or unsupported
    (cumulative points)."""
    refused: int = 0
    """Usage records refused: a count negative, fractional or above the ceiling."""


class _Refused(ValueError):
    pass


def parse(message: Message, body: bytes, encoding: Encoding) -> None:
    """Fill ``message`` from ``body``; :class:`BadExport` when it is not one."""
    try:
        if encoding == "json":
            json_format.Parse(body.decode("utf-8"), message, ignore_unknown_fields=True)
        else:
            message.ParseFromString(body)
    except (DecodeError, json_format.ParseError, UnicodeDecodeError, ValueError,
            RecursionError) as exc:
        kind = "OTLP/JSON" if encoding == "json" else "protobuf"
        raise BadExport(f"not a {type(message).__name__} ({kind}): {exc}") from None


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None or kind in ("array_value", "kvlist_value",
                                            "bytes_value") else getattr(v, kind)


def _attrs(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def _count(value: Any, name: str) -> int:
    """A token count: a non-negative integer (an int, an integral double, or digits)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise _Refused(f"{name}: not a count")
    if isinstance(value, float):
        if not value.is_integer():
            raise _Refused(f"{name}: {value!r} is not a whole number")
        value = int(value)
    elif isinstance(value, str):
        if not value.strip().lstrip("-").isdigit():
            raise _Refused(f"{name}: {value!r} is not a number")
        value = int(value)
    if not 0 <= value <= MAX_TOKENS_PER_CLASS:
        raise _Refused(f"{name}: {value} is outside 0..{MAX_TOKENS_PER_CLASS}")
    return int(value)


def _usd_micros(micros: Any, usd: Any) -> int | None:
    """The agent's cost in µUSD: its integer micros when it sent them, else its USD
    figure rounded half-even (the one place a reported float becomes money)."""
    if micros is not None:
        value = _count(micros, "cost_usd_micros") if not isinstance(micros, int) else micros
        if not 0 <= value <= MAX_AMOUNT:
            raise _Refused(f"cost_usd_micros: {value} is outside 0..{MAX_AMOUNT}")
        return value
    if usd is None:
        return None
    try:
        micro = (Decimal(str(usd)) * 1_000_000).quantize(Decimal(1), ROUND_HALF_EVEN)
    except (InvalidOperation, ValueError):
        raise _Refused(f"cost_usd: {usd!r} is not a number") from None
    if not 0 <= micro <= MAX_AMOUNT:
        raise _Refused(f"cost_usd: {usd!r} is outside 0..{MAX_AMOUNT} µUSD")
    return int(micro)


def _when(text: Any, *nanos: int) -> datetime:
    if isinstance(text, str):
        try:
            return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
        except ValueError:
            pass
    for n in nanos:
        if n > 0:
            return datetime.fromtimestamp(n / 1e9, UTC)
    return datetime.now(UTC)


def agent_of(service: str | None) -> str:
    """The agent a resource's ``service.name`` names (``codex_exec``, ``codex_tui``,
    ``codex_cli_rs`` are Codex)."""
    if service == "claude-code":
        return "claude-code"
    if service is not None and service.startswith("codex"):
        return "codex"
    return (service or "unknown")[:64]


def _digest(*parts: Any) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()


def _text(value: Any) -> str | None:
    return None if value is None else str(value)[:200]


# -- logs --------------------------------------------------------------------------------

def decode_logs(body: bytes, encoding: Encoding) -> Decoded:
    """The usage reports of an ``ExportLogsServiceRequest``."""
    export = ExportLogsServiceRequest()
    parse(export, body, encoding)
    reports: list[ClientReport] = []
    ignored = refused = 0
    for resource_logs in export.resource_logs:
        agent = agent_of(_attrs(resource_logs.resource.attributes).get("service.name"))
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                a = _attrs(record.attributes)
                name = str(a.get("event.name") or _value(record.body) or "")
                try:
                    report = _log_report(agent, name, a, record)
                except _Refused:
                    refused += 1
                    continue
                if report is None:
                    ignored += 1
                else:
                    reports.append(report)
    return Decoded(reports=reports, ignored=ignored, refused=refused)


def _log_report(agent: str, name: str, a: dict[str, Any], record: Any) -> ClientReport | None:
    when = _when(a.get("event.timestamp"), record.time_unix_nano,
                 record.observed_time_unix_nano)
    if name in ("api_request", "claude_code.api_request"):
        session, prompt, seq = a.get("session.id"), a.get("prompt.id"), a.get("event.sequence")
        event_id = (f"claude-code:{_digest(session, prompt, seq)}" if session and seq is not None
                    else f"claude-code:{_digest(record.SerializeToString(deterministic=True))}")
        return ClientReport(
            event_id=event_id, agent="claude-code", signal="event", session_id=_text(session),
            model=_text(a.get("model")), input_tokens=_count(a.get("input_tokens"), "input_tokens"),
            output_tokens=_count(a.get("output_tokens"), "output_tokens"),
            cache_read_tokens=_count(a.get("cache_read_tokens"), "cache_read_tokens"),
            cache_write_tokens=_count(a.get("cache_creation_tokens"), "cache_creation_tokens"),
            reported_cost_uusd=_usd_micros(a.get("cost_usd_micros"), a.get("cost_usd")),
            reported_at=when)
    if (name in ("codex.sse_event", "sse_event") and "input_token_count" in a
            and a.get("event.kind", "response.completed") == "response.completed"):
        total = _count(a.get("input_token_count"), "input_token_count")
        cached = _count(a.get("cached_token_count"), "cached_token_count")
        written = _count(a.get("cache_write_token_count"), "cache_write_token_count")
        if cached + written > total:
            raise _Refused("cached and cache-write tokens above input_token_count")
        return ClientReport(
            event_id=f"codex:{_digest(record.SerializeToString(deterministic=True))}",
            agent="codex" if agent == "unknown" else agent, signal="event",
            session_id=_text(a.get("conversation.id")), model=_text(a.get("model")),
            input_tokens=total - cached - written,
            output_tokens=_count(a.get("output_token_count"), "output_token_count"),
            cache_read_tokens=cached, cache_write_tokens=written, reported_cost_uusd=None,
            reported_at=when)
    return None


# -- metrics -----------------------------------------------------------------------------

_TOKEN_TYPES = {"input": "input_tokens", "output": "output_tokens",
                "cacheRead": "cache_read_tokens", "cacheCreation": "cache_write_tokens"}


def decode_metrics(body: bytes, encoding: Encoding) -> Decoded:
    """The usage reports of an ``ExportMetricsServiceRequest``: Claude Code's token and
    cost counters, one report per session, model and interval."""
    export = ExportMetricsServiceRequest()
    parse(export, body, encoding)
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    ignored = refused = 0
    bad: set[tuple[Any, ...]] = set()
    for resource_metrics in export.resource_metrics:
        agent = agent_of(_attrs(resource_metrics.resource.attributes).get("service.name"))
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point, kind in _usage_points(metric):
                    if point is None:
                        ignored += 1
                        continue
                    a = _attrs(point.attributes)
                    key = (agent, a.get("session.id"), a.get("model"), a.get("user.id"),
                           point.start_time_unix_nano, point.time_unix_nano)
                    group = groups.setdefault(key, {})
                    value = point.as_double if point.HasField("as_double") else point.as_int
                    try:
                        if kind == "cost":
                            group["reported_cost_uusd"] = (group.get("reported_cost_uusd", 0)
                                                           + (_usd_micros(None, value) or 0))
                        elif kind in _TOKEN_TYPES:
                            field = _TOKEN_TYPES[kind]
                            group[field] = group.get(field, 0) + _count(value, f"type={kind}")
                        else:
                            ignored += 1
                    except _Refused:
                        bad.add(key)
    reports = []
    for key, figures in groups.items():
        if key in bad:
            refused += 1
            continue
        agent, session, model, _, start, end = key
        reports.append(ClientReport(
            event_id=f"{agent}-metric:{_digest(*key)}", agent=agent, signal="metric",
            session_id=_text(session), model=_text(model),
            input_tokens=figures.get("input_tokens", 0),
            output_tokens=figures.get("output_tokens", 0),
            cache_read_tokens=figures.get("cache_read_tokens", 0),
            cache_write_tokens=figures.get("cache_write_tokens", 0),
            reported_cost_uusd=figures.get("reported_cost_uusd"),
            reported_at=_when(None, end, start)))
    return Decoded(reports=reports, ignored=ignored, refused=refused)


def _usage_points(metric: Any) -> Iterator[tuple[Any, str]]:
    """(point, kind) for each delta point of a usage counter; (None, "") for any other
    metric (once) or a cumulative point."""
    if metric.name not in ("claude_code.token.usage", "claude_code.cost.usage"):
        yield None, ""
        return
    if metric.WhichOneof("data") != "sum":
        yield None, ""
        return
    delta = metric.sum.aggregation_temporality == AggregationTemporality.Value(
        "AGGREGATION_TEMPORALITY_DELTA")
    for point in metric.sum.data_points:
        if not delta:
            yield None, ""
        elif metric.name == "claude_code.cost.usage":
            yield point, "cost"
        else:
            yield point, str(_attrs(point.attributes).get("type", ""))
