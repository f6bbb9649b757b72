"""Tracing with the OpenTelemetry SDK (the ``inferplane[otel]`` extra): imported only
when a ``telemetry:`` block is configured (:func:`gateway.telemetry.start_telemetry`).

One request's spans (attributes: :mod:`gateway.telemetry._semconv`)::

    {operation} {model}            SERVER  the request, from first byte to the response's end
    ├── apply_guardrail            INTERNAL  where a guardrail screened the request
    ├── admission                  INTERNAL  one per attempt: the Governor's decision
    ├── {operation} {upstream}     CLIENT  one per upstream attempt (routing may make several)
    └── settlement                 INTERNAL  one per attempt: the figures committed

The root continues the client's W3C ``traceparent``; each attempt sends its own
``traceparent`` upstream. Spans are ended explicitly with their parent's context handed
over (no context variables), so a stream's relay, which outlives its handler, needs none.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span as OtelSpan
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.telemetry._bridge import MetricsExport
from gateway.telemetry._export import BoundedExport
from gateway.telemetry._semconv import (
    SCHEMA_URL,
    error_type,
    operation_name,
    principal_attributes,
    provider_name,
    server_attributes,
    settlement_attributes,
    span_name,
)
from gateway.telemetry._trace import RequestTrace, Span, Telemetry

_PROPAGATOR = TraceContextTextMapPropagator()

# What an answer says of itself, read from its bytes as they pass (JSON or SSE, OpenAI's
# and Anthropic's shapes). A quoted key can only be a key: inside a string a quote is
# escaped. Never content: a model name, and reason words.
_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]{1,200})"')
_FINISH = re.compile(rb'"(?:finish_reason|stop_reason)"\s*:\s*"([a-z_]{1,40})"')


class _Answer:
    """An attempt's answer chunks, passed on unchanged, scanned for the model that
    answered and the finish reasons (``gen_ai.response.*``)."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks
        self.model: str | None = None
        self.reasons: list[str] = []

    def __aiter__(self) -> _Answer:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self._chunks.__anext__()
        if self.model is None and (found := _MODEL.search(chunk)) is not None:
            self.model = found.group(1).decode("utf-8", "replace")
        for reason in _FINISH.findall(chunk):
            self.reasons.append(reason.decode())
        return chunk

    def attributes(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.model is not None:
            out["gen_ai.response.model"] = self.model
        if self.reasons:
            out["gen_ai.response.finish_reasons"] = self.reasons
        return out


def _fail(span: OtelSpan, kind: str | None) -> None:
    if kind is not None:
        span.set_attribute("error.type", kind)
        span.set_status(Status(StatusCode.ERROR))


class StageSpan(Span):
    """A stage's span while it runs (ended when the ``with`` block exits)."""

    __slots__ = ("_span",)

    def __init__(self, span: OtelSpan) -> None:
        self._span = span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _fail(self._span, error_type(exc))
        self._span.end()

    def set(self, attributes: Mapping[str, Any]) -> None:
        self._span.set_attributes(attributes)


class OtelTrace(RequestTrace):
    """One request's spans (module docstring)."""

    __slots__ = ("_answers", "_attempts", "_root", "_context", "_owner", "_operation",
                 "_totals", "_stage")

    recording = True

    def __init__(self, owner: OtelTelemetry, root: OtelSpan, endpoint: str) -> None:
        self._owner = owner
        self._root = root
        self._context = set_span_in_context(root)
        self._operation = operation_name(endpoint)
        self._attempts: dict[int, OtelSpan] = {}
        self._answers: dict[int, _Answer] = {}
        self._totals = [0, 0, 0]  # committed, liability µUSD over the attempts; attempts
        self._stage: StageSpan | None = None

    def begin(self, call: Any) -> None:
        root = self._root
        root.update_name(span_name(self._operation, call.model.name))
        root.set_attributes({"gen_ai.request.model": call.model.name,
                             "gen_ai.request.stream": call.stream,
                             "inferplane.request_id": call.request_id,
                             **principal_attributes(call.principal)})
        if self._owner.capture_content:
            doc = call.client_doc
            messages = doc.get("messages", doc.get("input"))
            if messages is not None:
                root.set_attribute("gen_ai.input.messages", json.dumps(messages))

    def span(self, name: str, *, attempt: int | None = None, when: bool = True) -> Span:
        if not when:
            return super().span(name)
        span = self._owner.tracer.start_span(name, context=self._context)
        if attempt is not None:
            span.set_attribute("inferplane.attempt", attempt)
        if name == "apply_guardrail":
            span.set_attribute("gen_ai.operation.name", "apply_guardrail")
        self._stage = stage = StageSpan(span)
        return stage

    def dispatch(self, index: int, *, deployment: str, provider: str, model: str,
                 headers: dict[str, str]) -> dict[str, str]:
        upstream = self._owner.upstream(provider)
        span = self._owner.tracer.start_span(
            span_name(self._operation, model), context=self._context, kind=SpanKind.CLIENT,
            attributes={"gen_ai.operation.name": self._operation,
                        "gen_ai.request.model": model, "inferplane.attempt": index,
                        "inferplane.deployment": deployment, **upstream})
        self._attempts[index] = span
        self._totals[2] += 1
        if index == 0:
            self._root.set_attribute("gen_ai.provider.name", upstream["gen_ai.provider.name"])
        out = dict(headers)
        _PROPAGATOR.inject(out, context=set_span_in_context(span))
        return out

    def answer(self, index: int, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        self._answers[index] = answer = _Answer(chunks)
        return answer

    def settled(self, index: int, settlement: Any, *, status: int) -> None:
        figures = settlement_attributes(settlement)
        answer = self._answers.pop(index, None)
        if answer is not None:
            figures.update(answer.attributes())
        if self._stage is not None:
            self._stage.set(figures)
        self._totals[0] += settlement.usd_committed
        self._totals[1] += settlement.usd_liability
        self._root.set_attributes({
            **{k: v for k, v in figures.items() if k.startswith("gen_ai.")},
            "inferplane.outcome": figures["inferplane.outcome"],
            "inferplane.committed_uusd": self._totals[0],
            "inferplane.liability_uusd": self._totals[1],
            "inferplane.attempts": self._totals[2]})
        span = self._attempts.pop(index, None)
        if span is not None:
            span.set_attributes(figures)
            span.set_attribute("http.response.status_code", status)
            _fail(span, error_type(None, status))
            span.end()

    def end(self, status: int, error: BaseException | None = None) -> None:
        for span in self._attempts.values():  # dispatched, never settled here
            span.end()
        self._attempts.clear()
        root = self._root
        root.set_attribute("http.response.status_code", status)
        _fail(root, error_type(error, status))
        root.end()


class UnsampledTrace(RequestTrace):
    """A request the sampler left out: nothing is recorded, and its trace context (the
    unsampled flag) still goes upstream, so the trace stays one across the hops."""

    __slots__ = ("_context",)

    recording = True  # for dispatch: the upstream gets the context

    def __init__(self, context: dict[str, str]) -> None:
        self._context = context

    def dispatch(self, index: int, *, deployment: str, provider: str, model: str,
                 headers: dict[str, str]) -> dict[str, str]:
        return {**headers, **self._context}


class OtelTelemetry(Telemetry):
    """Tracing on: a tracer over the bounded export (``gateway.telemetry._export``)."""

    enabled = True

    def __init__(self, provider: TracerProvider, *, capture_content: bool,
                 providers: Mapping[str, tuple[str, str | None]],
                 export: BoundedExport | None, metrics: MetricsExport | None = None) -> None:
        self._provider = provider
        self.tracer: Tracer = provider.get_tracer("inferplane", schema_url=SCHEMA_URL)
        self.capture_content = capture_content
        self._upstreams = {name: self._upstream_attributes(kind, base_url)
                           for name, (kind, base_url) in providers.items()}
        """Configured provider name → its attempt spans' fixed attributes."""
        self._export = export
        self._metrics = metrics

    @staticmethod
    def _upstream_attributes(kind: str, base_url: str | None) -> dict[str, Any]:
        return {"gen_ai.provider.name": provider_name(kind), **server_attributes(base_url)}

    def upstream(self, provider: str) -> dict[str, Any]:
        """A provider's fixed attributes (provider name, server address and port)."""
        found = self._upstreams.get(provider)
        return found if found is not None else self._upstream_attributes(provider, None)

    def request(self, headers: Mapping[str, str], endpoint: str) -> RequestTrace:
        if self._export is None:  # telemetry.traces: false (metrics only)
            return super().request(headers, endpoint)
        parent = _PROPAGATOR.extract(headers) if "traceparent" in headers else None
        operation = operation_name(endpoint)
        root = self.tracer.start_span(operation, context=parent, kind=SpanKind.SERVER,
                                      attributes={"gen_ai.operation.name": operation})
        if not root.is_recording():  # not sampled: no span objects past this one
            context: dict[str, str] = {}
            _PROPAGATOR.inject(context, context=set_span_in_context(root))
            return UnsampledTrace(context)
        return OtelTrace(self, root, endpoint)

    def dropped(self) -> int:
        return self._export.dropped_count if self._export is not None else 0

    async def aclose(self) -> None:
        if self._metrics is not None:
            await self._metrics.aclose()
        await asyncio.to_thread(self._provider.shutdown)


def tracer_provider(*, service: str, instance: str, ratio: float) -> TracerProvider:
    resource = Resource.create({"service.name": service, "service.instance.id": instance},
                               schema_url=SCHEMA_URL)
    return TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(ratio)))
