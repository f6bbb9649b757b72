"""The request path's view of tracing: one :class:`RequestTrace` per request.

The ingress asks the process's :class:`Telemetry` for a request's trace once, hands that
one value through its stages (the :class:`gateway.ingress._call.Call` carries it) and
tells it what happened at each: the request's facts once prepared, a stage's span
(admission, settlement, a guardrail), each upstream attempt, the end. Without a
``telemetry:`` block every call lands on :data:`OFF`, whose methods return at once and
import nothing: the off path costs a few attribute lookups per stage.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any


class Span:
    """One stage's span, as a context manager (the no-op one: nothing recorded)."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def set(self, attributes: Mapping[str, Any]) -> None:
        """Attributes learnt during the stage (figures, counts: never content)."""


NO_SPAN = Span()


class RequestTrace:
    """One request's spans; this base records nothing (tracing off, or not sampled)."""

    __slots__ = ()

    recording = False

    def begin(self, call: Any) -> None:
        """The request prepared: who asked, for which model (the root span's name)."""

    def span(self, name: str, *, attempt: int | None = None, when: bool = True) -> Span:
        """A child span of the request for one stage (``when`` False: none)."""
        return NO_SPAN

    def dispatch(self, index: int, *, deployment: str, provider: str, model: str,
                 headers: dict[str, str]) -> dict[str, str]:
        """Attempt ``index`` leaves for ``provider``: its span starts; returns the headers
        to send upstream (``headers`` with this attempt's ``traceparent``). ``provider`` is
        the configured provider's name, ``model`` the name sent upstream."""
        return headers

    def answer(self, index: int, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Attempt ``index``'s answer as it arrives (unchanged): the model that answered
        and the finish reasons are read from it."""
        return chunks

    def settled(self, index: int, settlement: Any, *, status: int) -> None:
        """Attempt ``index`` settled: its figures recorded, its span ended."""

    def end(self, status: int, error: BaseException | None = None) -> None:
        """The response is over (however it ended): the root span ends."""


OFF = RequestTrace()


class Telemetry:
    """The process's tracing and OTLP metrics; this base exports nothing (off)."""

    enabled = False

    def request(self, headers: Mapping[str, str], endpoint: str) -> RequestTrace:
        """A new request's trace, continuing the client's ``traceparent``."""
        return OFF

    def dropped(self) -> int:
        """Spans dropped so far (queue full, or their export failed)."""
        return 0

    async def aclose(self) -> None:
        """Flush what is queued (bounded by the export timeout) and stop."""


TELEMETRY_OFF = Telemetry()
