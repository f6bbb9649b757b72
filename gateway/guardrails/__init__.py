"""Guardrails (issue 39, ADR-050's V1): PII and secrets masked, pseudonymized or blocked
in requests and answers, JSON and streamed. docs/guardrails.md is the reference."""

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from gateway.errors import BadRequest, ConfigError
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
    GuardrailPresidio,
    GuardrailProfile,
    GuardrailRule,
    GuardrailSettings,
    GuardrailWebhook,
)
from gateway.guardrails._stream import StreamGuard
from gateway.guardrails._webhook import GuardrailUnavailable, check


async def guard_request(settings: GuardrailSettings, team_id: str, profiles: tuple[str, ...],
                        doc: dict[str, Any], body: bytes, *, endpoint: str, request_id: str,
                        registry: CollectorRegistry | None
                        ) -> tuple[dict[str, Any], bytes, Guard | None]:
    """The screen step: the built-in detectors and tenant rules (:func:`screen`), then
    Presidio and the webhook checker when configured. Raises to refuse (nothing admitted)."""
    doc, body, guard = screen(settings, profiles, doc, body, request_id=request_id,
                              registry=registry)
    if guard is not None and settings.presidio is not None:
        from gateway.guardrails._presidio import screen_presidio  # the optional extra
        doc, body = await screen_presidio(settings.presidio, guard, doc, body)
    if guard is not None and settings.webhook is not None:
        await check(settings.webhook, guard, doc, endpoint=endpoint, team_id=team_id)
    return doc, body, guard


async def warm_presidio(conf: GuardrailPresidio) -> None:
    """Load Presidio and its spaCy pipeline at startup (seconds, once), not on the first
    request; a model that does not load is a ConfigError naming ``guardrails.presidio``."""
    from gateway.guardrails._presidio import warm  # the optional extra
    try:
        await warm(conf)
    except Exception as exc:  # noqa: BLE001 — whatever spaCy raises, startup names the key
        raise ConfigError(f"guardrails.presidio: cannot load the model {conf.model!r} "
                          f"({type(exc).__name__}: {exc})") from exc


def check_profiles(settings: GuardrailSettings, names: Sequence[str]) -> None:
    """Refuse to give a team a profile this gateway's config does not define
    (``guardrails.profiles``): a 400 naming the first unknown one and the known ones."""
    unknown = [n for n in names if n not in settings.profiles]
    if unknown:
        known = ", ".join(sorted(settings.profiles)) or "none are configured"
        raise BadRequest(f"guardrails: profile {unknown[0]!r} is not configured "
                         f"(guardrails.profiles: {known})", param="guardrails")


def stream_filter(guard: Guard | None, endpoint: str) -> StreamGuard | None:
    """The filter a streamed answer goes through (None: sent as the upstream sent it)."""
    if guard is None or not guard.filters_answers:
        return None
    return StreamGuard(guard, endpoint)


__all__ = [
    "DEFAULT_ACTIONS", "DETECTORS", "NAMES", "Detector", "Finding", "Guard",
    "GuardrailBlocked", "GuardrailPresidio", "GuardrailProfile", "GuardrailRule",
    "GuardrailSettings",
    "GuardrailUnavailable", "GuardrailWebhook", "Policy", "StreamGuard", "check_profiles",
    "guard_request", "metrics_for", "policy_for", "scan", "screen", "stream_filter", "vet",
    "walk", "warm_presidio",
]
