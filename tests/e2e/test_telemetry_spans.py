"""OpenTelemetry over OTLP/HTTP (issue 40): a real ``mayu serve`` exporting to a real
receiver process (``tests/e2e/otlp_receiver.py``), driven by the real openai SDK."""

from __future__ import annotations

import re
import statistics
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.e2e._otlp import OtlpReceiver, closed_port, otlp_receiver
from tests.e2e._procs import (
    Proc,
    create_key,
    create_team,
    header_tap,
    settled_line,
    start_gateway,
    start_mock_upstream,
)

pytestmark = pytest.mark.e2e

PRICE = {"input": 1_000_000, "output": 4_000_000, "cache_read": 100_000,
         "cache_write_5m": 1_250_000, "cache_write_1h": 2_000_000}
FAST = {"batch_delay_s": 0.2, "metrics_interval_s": 1.0}
ADMIN_TOKEN = "admin-" + "0123456789abcdef" * 3


@dataclass
class Served:
    gateway: Proc
    key: str
    data: Path
    tap: Path

    def client(self, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.gateway.url}/v1", api_key=self.key,
                             default_headers=headers or None, max_retries=0, timeout=30)

    def prometheus(self, name: str) -> float:
        text = httpx.get(f"{self.gateway.url}/metrics", timeout=10).text
        found = re.search(rf"^{name} (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0


def _stream(served: Served, text: str, **headers: str) -> tuple[str, dict[str, str]]:
    """One streamed chat completion: (its request id, its response headers)."""
    request_id, answer, _ = _chunks(served, text, **headers)
    return request_id, answer


def _chunks(served: Served, text: str, **headers: str
            ) -> tuple[str, dict[str, str], list[Any]]:
    """One streamed chat completion: its request id, response headers and chunks."""
    with served.client(**headers).chat.completions.with_streaming_response.create(
            model="gpt-up", max_tokens=16, stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": text}]) as response:
        chunks = list(response.parse())
        assert chunks and chunks[-1].usage is not None
        return response.headers["x-inferplane-request-id"], dict(response.headers), chunks


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start_mock_upstream(tmp_path_factory.mktemp("upstream"))
    yield proc
    proc.stop()


def _serve(workdir: Path, upstream: Proc, telemetry: dict[str, Any] | None,
           **extra: Any) -> Iterator[Served]:
    """A gateway in front of ``upstream`` through a header tap, with ``telemetry`` (and
    ``extra`` top-level settings)."""
    tap_file = workdir / "upstream-bytes.txt"
    with header_tap(upstream.port, tap_file) as tap_port:
        config = workdir / "mayu.yaml"
        config.write_text(yaml.safe_dump({
            "data_dir": str(workdir / "data"), "demo": False,
            "server": {"admin_token_ref": "env:MAYU_E2E_ADMIN_TOKEN"},
            "providers": [{"name": "up", "kind": "openai",
                           "base_url": f"http://127.0.0.1:{tap_port}/v1", "timeout_s": 30}],
            "models": [{"name": "gpt-up", "price": PRICE,
                        "deployments": [{"provider": "up", "upstream_model": "mock-gpt"}]}],
            **({"telemetry": telemetry} if telemetry is not None else {}), **extra}))
        create_team(config, "otel")
        key = create_key(config, "otel")
        gateway = start_gateway(config, env={"MAYU_E2E_ADMIN_TOKEN": ADMIN_TOKEN})
        try:
            yield Served(gateway, key, workdir / "data", tap_file)
        finally:
            gateway.stop()


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OtlpReceiver]:
    with otlp_receiver(tmp_path_factory.mktemp("otlp")) as r:
        yield r


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, upstream: Proc,
           receiver: OtlpReceiver) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("traced"), upstream,
                      {"endpoint": receiver.url, "service_name": "mayu-e2e", **FAST},
                      guardrails={"enabled": True})  # e-mail addresses masked


def _trace(receiver: OtlpReceiver, request_id: str) -> list[dict[str, Any]]:
    """Every span of the request's trace, once its four kinds have arrived."""
    def of_request(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        roots = [s for s in rows if s["attributes"].get("inferplane.request_id") == request_id]
        return [s for s in rows if roots and s["trace_id"] == roots[0]["trace_id"]]

    def complete(rows: list[dict[str, Any]]) -> bool:
        names = {s["name"] for s in of_request(rows)}
        return {"chat gpt-up", "admission", "chat mock-gpt", "settlement"} <= names
    return of_request(receiver.wait(receiver.spans, complete))


def test_streamed_request_exports_the_span_tree(traced: Served, receiver: OtlpReceiver) -> None:
    """A streamed request's trace: root, admission, attempt and settlement spans with the
    GenAI attributes, its figures equal to its settled usage log line."""
    request_id, headers, chunks = _chunks(traced, "hello spans")
    spans = {s["name"]: s for s in _trace(receiver, request_id)}
    root, attempt = spans["chat gpt-up"], spans["chat mock-gpt"]
    reasons = [c.choices[0].finish_reason for c in chunks
               if c.choices and c.choices[0].finish_reason]
    assert reasons
    for span in (root, attempt):
        assert span["attributes"]["gen_ai.response.model"] == chunks[0].model
        assert span["attributes"]["gen_ai.response.finish_reasons"] == reasons
    for child in ("admission", "chat mock-gpt", "settlement"):
        assert spans[child]["parent_span_id"] == root["span_id"], child
    assert root["parent_span_id"] == ""
    assert root["kind"] == 2 and attempt["kind"] == 3  # SERVER, CLIENT
    assert root["resource"]["service.name"] == "mayu-e2e"
    a, r = attempt["attributes"], root["attributes"]
    assert a["gen_ai.operation.name"] == r["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.provider.name"] == r["gen_ai.provider.name"] == "openai"
    assert r["gen_ai.request.model"] == "gpt-up" and a["gen_ai.request.model"] == "mock-gpt"
    assert a["server.address"] == "127.0.0.1" and a["server.port"] > 0
    assert a["http.response.status_code"] == r["http.response.status_code"] == 200
    line = settled_line(traced.data, request_id=request_id)
    usage = line["usage"]
    writes = usage["cache_write_5m"] + usage["cache_write_1h"] + usage["cache_write_unknown"]
    for span in (root, attempt, spans["settlement"]):
        at = span["attributes"]
        assert at["gen_ai.usage.input_tokens"] == usage["input"] + usage["cache_read"] + writes
        assert at["gen_ai.usage.output_tokens"] == usage["output"] > 0
        assert at["gen_ai.usage.cache_read.input_tokens"] == usage["cache_read"]
        assert at["gen_ai.usage.cache_creation.input_tokens"] == writes
        assert at["inferplane.committed_uusd"] == line["usd_committed"] > 0
        assert at["inferplane.liability_uusd"] == line["usd_liability"] == 0
        assert at["inferplane.outcome"] == "complete"
    assert r["inferplane.team"] == line["team_id"] and r["inferplane.key_id"] == line["key_id"]
    assert r["inferplane.attempts"] == 1
    assert headers["x-inferplane-permit"] == line["permit"]


def test_client_traceparent_is_continued_and_sent_upstream(
        traced: Served, receiver: OtlpReceiver) -> None:
    """A client's traceparent is continued (its trace id, its span as the root's parent)
    and the upstream receives a traceparent of that trace, naming the attempt's span."""
    trace_id, parent = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    request_id, _ = _stream(traced, "hello parent", traceparent=f"00-{trace_id}-{parent}-01")
    spans = {s["name"]: s for s in _trace(receiver, request_id)}
    assert {s["trace_id"] for s in spans.values()} == {trace_id}
    assert spans["chat gpt-up"]["parent_span_id"] == parent
    sent = re.findall(rb"traceparent: 00-([0-9a-f]{32})-([0-9a-f]{16})-01",
                      traced.tap.read_bytes(), re.I)
    assert (trace_id.encode(), spans["chat mock-gpt"]["span_id"].encode()) in sent


def test_no_prompt_text_is_exported_by_default(traced: Served, receiver: OtlpReceiver) -> None:
    """Without capture_content, a prompt's text is in no span, attribute or event."""
    secret = f"planted-{uuid.uuid4().hex}"
    request_id, _ = _stream(traced, f"please remember {secret}")
    _trace(receiver, request_id)
    assert request_id in receiver.raw_text()
    assert secret not in receiver.raw_text()


def test_a_guardrail_span_counts_findings_and_exports_no_match(
        traced: Served, receiver: OtlpReceiver) -> None:
    """Where a guardrail screened the request: an apply_guardrail span with the number of
    findings, and the matched text nowhere in what was exported."""
    email = f"otel-{uuid.uuid4().hex[:12]}@example.com"
    request_id, _ = _stream(traced, f"write to {email} please")
    spans = _trace(receiver, request_id)
    guard = [s for s in spans if s["name"] == "apply_guardrail"]
    assert len(guard) == 1 and guard[0]["attributes"]["gen_ai.guardrail.findings"] == 1
    assert guard[0]["attributes"]["gen_ai.operation.name"] == "apply_guardrail"
    assert email not in receiver.raw_text() and email.split("@")[0] not in receiver.raw_text()


def test_otlp_metrics_equal_prometheus(traced: Served, receiver: OtlpReceiver) -> None:
    """The spend counters arrive over OTLP with the figures /metrics serves (once this
    request's settlement is in both: the store takes it after the answer left)."""
    request_id, _ = _stream(traced, "hello metrics")
    settled_line(traced.data, request_id=request_id)
    names = ("mayu_committed_micro_usd_total", "mayu_reserved_micro_usd_total",
             "mayu_liability_micro_usd_total")

    def latest() -> dict[str, Any]:
        return {r["name"]: r["value"] for r in receiver.metrics() if r["name"] in names}
    end = time.monotonic() + 30
    while True:
        scraped = {n: traced.prometheus(n) for n in names}
        exported = latest()
        if exported == scraped and scraped["mayu_committed_micro_usd_total"] > 0:
            break
        assert time.monotonic() < end, f"OTLP {exported} != /metrics {scraped}"
        time.sleep(0.2)
    assert any(r["resource"].get("service.name") == "mayu-e2e" for r in receiver.metrics())


def test_nothing_is_exported_without_a_telemetry_block(
        tmp_path_factory: pytest.TempPathFactory, upstream: Proc) -> None:
    """No telemetry block: requests carry no trace context and the receiver gets nothing."""
    workdir = tmp_path_factory.mktemp("untraced")
    with otlp_receiver(workdir) as quiet:
        for served in _serve(workdir, upstream, None):
            _stream(served, "hello silence")
            time.sleep(2.0)  # well past the traced gateway's 0.2 s batch delay
            assert b"traceparent" not in served.tap.read_bytes()
            assert "mayu_telemetry" not in httpx.get(f"{served.gateway.url}/metrics").text
        assert quiet.raw_text() == ""


@pytest.mark.parametrize("collector", ["closed", "hanging"])
def test_a_collector_down_never_slows_or_fails_a_request(
        tmp_path_factory: pytest.TempPathFactory, upstream: Proc, traced: Served,
        collector: str) -> None:
    """A collector that refuses or hangs: every request succeeds, none waits on the export
    (each under the 3 s export timeout; the median within 250 ms of a gateway whose
    collector is healthy, requests alternating), and the dropped count rises."""
    workdir = tmp_path_factory.mktemp(collector)

    def run(url: str) -> None:
        conf = {"endpoint": url, "export_timeout_s": 3.0, "queue_size": 8, **FAST}
        for served in _serve(workdir, upstream, conf):
            _stream(served, "warm up")
            healthy: list[float] = []
            down: list[float] = []
            for i in range(8):  # alternating: the machine's load falls on both alike
                for target, times in ((traced, healthy), (served, down)):
                    start = time.perf_counter()
                    _stream(target, f"hello {i}")
                    times.append(time.perf_counter() - start)
            print(f"{collector}: median {statistics.median(down) * 1000:.1f} ms vs "
                  f"{statistics.median(healthy) * 1000:.1f} ms healthy; max "
                  f"{max(down) * 1000:.1f} ms")
            assert max(down) < 3.0
            assert statistics.median(down) < statistics.median(healthy) + 0.25
            end = time.monotonic() + 30
            while served.prometheus("mayu_telemetry_dropped_spans_total") == 0:
                assert time.monotonic() < end, "no span was counted as dropped"
                time.sleep(0.2)
            status = httpx.get(f"{served.gateway.url}/admin/v1/status", timeout=10,
                               headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()
            assert status["telemetry_dropped_spans"] > 0

    if collector == "closed":
        run(f"http://127.0.0.1:{closed_port()}")
    else:
        with otlp_receiver(workdir, hang=True) as hanging:
            run(hanging.url)
