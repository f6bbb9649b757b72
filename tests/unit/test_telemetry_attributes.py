"""The telemetry's attribute mapping, settings and export queue (no I/O)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from prometheus_client import CollectorRegistry

from gateway.config import Settings
from gateway.errors import ConfigError
from gateway.pricing import Usage
from gateway.telemetry import (
    OFF,
    SEMCONV_VERSION,
    TELEMETRY_OFF,
    TelemetrySettings,
    error_type,
    operation_name,
    principal_attributes,
    provider_name,
    server_attributes,
    settlement_attributes,
    span_name,
    start_telemetry,
    usage_attributes,
)

ROOT = Path(__file__).resolve().parents[2]


def test_provider_kinds_map_to_the_conventions_names() -> None:
    """Each provider kind is named as the GenAI conventions name its system."""
    assert [provider_name(k) for k in ("openai", "anthropic", "bedrock", "vertex", "azure")] \
        == ["openai", "anthropic", "aws.bedrock", "gcp.vertex_ai", "azure.ai.openai"]
    assert provider_name("mock") == "mock"


def test_operations_and_span_names() -> None:
    """Chat-like endpoints are ``chat``, embeddings ``embeddings``; spans ``{op} {model}``."""
    assert [operation_name(e) for e in ("chat", "messages", "responses", "embeddings")] \
        == ["chat", "chat", "chat", "embeddings"]
    assert span_name("chat", "gpt-4o") == "chat gpt-4o"
    assert span_name("chat", None) == "chat"
    assert SEMCONV_VERSION == "1.44.0"


def test_usage_input_tokens_include_the_cached_classes() -> None:
    """gen_ai.usage.input_tokens counts cached reads and writes (ours excludes them)."""
    usage = Usage(input=10, output=7, cache_read=100, cache_write_5m=3, cache_write_1h=2,
                  cache_write_unknown=1)
    assert usage_attributes(usage) == {
        "gen_ai.usage.input_tokens": 116, "gen_ai.usage.output_tokens": 7,
        "gen_ai.usage.cache_read.input_tokens": 100,
        "gen_ai.usage.cache_creation.input_tokens": 6}


def test_settlement_figures_are_integers_of_micro_usd() -> None:
    """A settlement's committed and liability µUSD and outcome, as they were settled."""
    settlement = SimpleNamespace(kind="uncertain", usd_committed=123, usd_liability=45,
                                 tokens_committed=9, usage=None)
    assert settlement_attributes(settlement) == {
        "inferplane.outcome": "uncertain", "inferplane.committed_uusd": 123,
        "inferplane.liability_uusd": 45, "inferplane.tokens_committed": 9}


def test_principal_server_and_error_attributes() -> None:
    """Who asked (ids only), the upstream's address, and error.type's source."""
    who = SimpleNamespace(team_id="t1", key_id="k1", user=None)
    assert principal_attributes(who) == {"inferplane.team": "t1", "inferplane.key_id": "k1"}
    assert principal_attributes(SimpleNamespace(team_id="t", key_id="k", user="ann"))[
        "inferplane.user"] == "ann"
    assert server_attributes("https://api.openai.com/v1") == {
        "server.address": "api.openai.com", "server.port": 443}
    assert server_attributes("http://127.0.0.1:8080") == {
        "server.address": "127.0.0.1", "server.port": 8080}
    assert server_attributes(None) == {}
    assert error_type(None, 200) is None and error_type(None, 429) == "429"
    assert error_type(ConfigError("x")) == getattr(ConfigError, "code", "ConfigError")
    assert error_type(ValueError("x")) == "ValueError"


def test_settings_errors_name_the_key() -> None:
    """A bad telemetry block fails naming its key; the default is off."""
    assert Settings().telemetry is None
    decoded = msgspec.convert({"telemetry": {"endpoint": "http://c:4318"}}, Settings)
    assert decoded.telemetry is not None and decoded.telemetry.capture_content is False
    with pytest.raises(msgspec.ValidationError, match=r"telemetry.sample_ratio"):
        msgspec.convert({"telemetry": {"endpoint": "http://c:4318", "sample_ratio": 2}},
                        Settings)
    with pytest.raises(msgspec.ValidationError, match=r"telemetry.endpoint"):
        msgspec.convert({"telemetry": {"endpoint": "c:4318"}}, Settings)
    with pytest.raises(msgspec.ValidationError, match=r"captureContent"):
        msgspec.convert({"telemetry": {"endpoint": "http://c", "captureContent": True}},
                        Settings)


def test_off_without_settings_and_a_clear_error_without_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No block: the no-op telemetry. A block without the extra: an error naming the key
    and the install command."""
    registry = CollectorRegistry()
    assert start_telemetry(None, registry=registry) is TELEMETRY_OFF
    assert TELEMETRY_OFF.request({}, "chat") is OFF
    monkeypatch.setitem(sys.modules,
                        "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ConfigError, match=r"^telemetry: .*inferplane\[otel\]"):
        start_telemetry(TelemetrySettings(endpoint="http://127.0.0.1:1"), registry=registry)


def test_the_off_path_imports_no_opentelemetry_sdk() -> None:
    """Serving without a telemetry block never imports the OpenTelemetry SDK or API."""
    code = ("import sys, gateway.app, gateway.ingress, gateway.cli; "
            "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', "
            "'opentelemetry.trace', 'opentelemetry.exporter', 'gateway.telemetry._otel'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


class _Refusing(SpanExporter):
    def __init__(self) -> None:
        self.batches = 0

    def export(self, spans: object) -> SpanExportResult:
        self.batches += 1
        return SpanExportResult.FAILURE


def test_a_full_queue_and_a_failed_export_count_as_dropped() -> None:
    """Spans beyond the queue are dropped at once; a batch the collector refused too."""
    from gateway.telemetry._export import BoundedExport, counters

    registry = CollectorRegistry()
    dropped, exported = counters(registry)
    exporter = _Refusing()
    export = BoundedExport(exporter, queue_size=3, delay_s=3600, dropped=dropped,
                           exported=exported)
    provider = TracerProvider()
    provider.add_span_processor(export)
    tracer = provider.get_tracer("t")
    for _ in range(5):
        tracer.start_span("s").end()
    assert export.dropped_count == 2  # the queue holds 3; nothing waited
    provider.shutdown()  # sends the 3 queued: refused, dropped
    assert export.dropped_count == 5 and exporter.batches == 1
    assert registry.get_sample_value("mayu_telemetry_dropped_spans_total") == 5


async def test_cluster_gauges_say_what_each_budget_has_left() -> None:
    """``mayu_cluster_budget_remaining_micro_usd``: the limit less committed, liability and
    reserved, 0 past it (what /v1/me says), bridged to OTLP like every family."""
    from gateway.cluster_metrics import BudgetFigures, ClusterFigures, ClusterView

    async def read(day: str, month: str) -> ClusterFigures:
        return ClusterFigures(budgets=[
            BudgetFigures("team:t1:usd:day:2026-12-07", limit=1000, committed=300,
                          liability=50, reserved=100),
            BudgetFigures("key:k1:usd:month:2026-12", limit=10, committed=20,
                          liability=0, reserved=0)])
    view = ClusterView(pseudonym=lambda s: s, team_labels=True)
    view.reader = read
    await view.refresh()
    registry = CollectorRegistry()
    registry.register(view)
    assert registry.get_sample_value("mayu_cluster_budget_remaining_micro_usd", {
        "scope": "team", "id": "t1", "team": "", "window": "day"}) == 550
    assert registry.get_sample_value("mayu_cluster_budget_remaining_micro_usd", {
        "scope": "key", "id": "k1", "team": "", "window": "month"}) == 0


def _recorded(capture_content: bool = False) -> tuple[object, object]:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from gateway.telemetry._otel import OtelTelemetry, tracer_provider

    memory = InMemorySpanExporter()
    provider = tracer_provider(service="t", instance="i", ratio=1.0)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    export = SimpleNamespace(dropped_count=0)
    return OtelTelemetry(provider, capture_content=capture_content,
                         providers={"up": ("bedrock", None)}, export=export), memory  # type: ignore[arg-type]


def _call(text: str) -> SimpleNamespace:
    return SimpleNamespace(model=SimpleNamespace(name="claude"), stream=False,
                           request_id="req_1", client_doc={"messages": [
                               {"role": "user", "content": text}]},
                           principal=SimpleNamespace(team_id="t", key_id="k", user="ann"))


def test_a_refusal_marks_admission_and_root_with_its_code() -> None:
    """A refused admission: the admission span and the root carry the refusal's code as
    error.type; no attempt span is left open."""
    from gateway.errors import InferplaneError

    class Refused(InferplaneError):
        code = "budget_exceeded"

    telemetry, memory = _recorded()
    trace = telemetry.request({}, "messages")  # type: ignore[attr-defined]
    trace.begin(_call("hi"))
    with pytest.raises(Refused), trace.span("admission", attempt=0):
        raise Refused("no")
    trace.end(402, Refused("no"))
    spans = {s.name: s for s in memory.get_finished_spans()}  # type: ignore[attr-defined]
    assert set(spans) == {"chat claude", "admission"}
    assert spans["admission"].attributes["error.type"] == "budget_exceeded"
    root = spans["chat claude"].attributes
    assert root["error.type"] == "budget_exceeded" and root["inferplane.user"] == "ann"
    assert "gen_ai.input.messages" not in root


def test_capture_content_exports_the_messages_only_when_on() -> None:
    """capture_content: the request's messages as gen_ai.input.messages on the root."""
    telemetry, memory = _recorded(capture_content=True)
    trace = telemetry.request({}, "messages")  # type: ignore[attr-defined]
    trace.begin(_call("the planted words"))
    headers = trace.dispatch(0, deployment="d", provider="up", model="anthropic.claude",
                             headers={"anthropic-version": "x"})
    assert headers["anthropic-version"] == "x" and headers["traceparent"].startswith("00-")
    trace.end(200)
    spans = {s.name: s for s in memory.get_finished_spans()}  # type: ignore[attr-defined]
    assert "the planted words" in spans["chat claude"].attributes["gen_ai.input.messages"]
    attempt = spans["chat anthropic.claude"].attributes
    assert attempt["gen_ai.provider.name"] == "aws.bedrock"


def test_an_unsampled_request_records_nothing_and_still_passes_its_context() -> None:
    """sample_ratio 0: no span is exported; the upstream still gets the client's trace id
    (flagged unsampled)."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from gateway.telemetry._otel import OtelTelemetry, tracer_provider

    memory = InMemorySpanExporter()
    provider = tracer_provider(service="t", instance="i", ratio=0.0)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    telemetry = OtelTelemetry(provider, capture_content=False, providers={},
                              export=SimpleNamespace(dropped_count=0))  # type: ignore[arg-type]
    trace = telemetry.request({}, "chat")
    trace.begin(_call("hi"))
    with trace.span("admission", attempt=0):
        pass
    sent = trace.dispatch(0, deployment="d", provider="up", model="m", headers={"a": "b"})
    trace.end(200)
    assert memory.get_finished_spans() == ()
    assert sent["a"] == "b" and int(sent["traceparent"][-2:], 16) & 1 == 0  # unsampled
    parent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-00"
    sent = telemetry.request({"traceparent": parent}, "chat").dispatch(
        0, deployment="d", provider="up", model="m", headers={})
    assert sent["traceparent"].startswith("00-" + "ab" * 16 + "-")


class _Held(SpanExporter):
    """Takes every batch; the first one only once ``release`` is set."""

    def __init__(self) -> None:
        self.batches = 0
        self.release = threading.Event()

    def export(self, spans: object) -> SpanExportResult:
        self.batches += 1
        assert self.release.wait(60)
        return SpanExportResult.SUCCESS


def test_shutdown_sends_one_more_batch_at_most_and_counts_the_rest() -> None:
    """Stopping while a batch is being sent: one more export at most (a hung collector
    costs one deadline, not one per batch); what is still queued is dropped and counted."""
    from gateway.telemetry._export import BATCH, BoundedExport, counters

    registry = CollectorRegistry()
    dropped, exported = counters(registry)
    exporter = _Held()
    export = BoundedExport(exporter, queue_size=10 * BATCH, delay_s=3600, dropped=dropped,
                           exported=exported)
    provider = TracerProvider()
    provider.add_span_processor(export)
    tracer = provider.get_tracer("t")
    for _ in range(2 * BATCH + 10):  # the BATCH-th wakes the thread: batch 1 is held
        tracer.start_span("s").end()
    stopping = threading.Thread(target=provider.shutdown)
    stopping.start()
    end = time.monotonic() + 60
    while not export._stopping.is_set():  # shutdown has begun
        assert time.monotonic() < end
        time.sleep(0.01)
    exporter.release.set()
    stopping.join(60)
    assert exporter.batches == 2  # the held one, then one more
    assert export.dropped_count == 10
    assert registry.get_sample_value("mayu_telemetry_exported_spans_total") == 2 * BATCH


async def test_the_answer_says_its_model_and_finish_reasons_never_its_text() -> None:
    """Read as the bytes pass: Anthropic's message_start model and stop_reason, OpenAI's
    finish_reason per choice; a quoted key inside the answer's text is not taken."""
    from gateway.telemetry._otel import _Answer

    async def chunks() -> Any:
        yield (b'event: message_start\ndata: {"type":"message_start","message":{"model":'
               b'"claude-x","stop_reason":null,"content":[]}}\n\n')
        yield (b'data: {"type":"content_block_delta","delta":{"text":"say \\"model\\":'
               b' \\"fake\\" and \\"stop_reason\\":\\"fake\\""}}\n\n')
        yield b'data: {"type":"message_delta","delta":{"stop_reason":"end_turn"}}\n\n'
    answer = _Answer(chunks())
    got = [c async for c in answer]
    assert len(got) == 3
    assert answer.attributes() == {"gen_ai.response.model": "claude-x",
                                   "gen_ai.response.finish_reasons": ["end_turn"]}

    async def openai() -> Any:
        yield (b'{"model": "gpt-4o-2024", "choices": [{"finish_reason": "stop"}, '
               b'{"finish_reason": "length"}]}')
    answer = _Answer(openai())
    assert [c async for c in answer] and answer.attributes() == {
        "gen_ai.response.model": "gpt-4o-2024",
        "gen_ai.response.finish_reasons": ["stop", "length"]}
