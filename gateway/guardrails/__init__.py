"""Guardrails (issue 39, ADR-050's V1): PII and secrets masked, pseudonymized or blocked
in requests and answers, JSON and streamed. docs/guardrails.md is the reference."""

from gateway.guardrails._detect import DETECTORS, NAMES, Detector, Finding, scan
from gateway.guardrails._guard import (
    Guard,
    GuardrailBlocked,
    Policy,
    metrics_for,
    policy_for,
    screen,
    walk,
)
from gateway.guardrails._rules import vet
from gateway.guardrails._settings import (
    DEFAULT_ACTIONS,
    GuardrailProfile,
    GuardrailRule,
    GuardrailSettings,
)
from gateway.guardrails._stream import StreamGuard


def stream_filter(guard: Guard | None, endpoint: str) -> StreamGuard | None:
    """The filter a streamed answer goes through (None: sent as the upstream sent it)."""
    if guard is None or not guard.filters_answers:
        return None
    return StreamGuard(guard, endpoint)


__all__ = [
    "DEFAULT_ACTIONS", "DETECTORS", "NAMES", "Detector", "Finding", "Guard",
    "GuardrailBlocked", "GuardrailProfile", "GuardrailRule", "GuardrailSettings", "Policy",
    "StreamGuard", "metrics_for", "policy_for", "scan", "screen", "stream_filter", "vet",
    "walk",
]
