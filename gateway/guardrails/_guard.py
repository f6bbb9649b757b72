"""One request's guard: its team's compiled policy, its findings, its pseudonym mapping.

:func:`screen` runs on the request's parsed body (every string of every ingress shape:
:func:`walk`) and returns the body to forward; :meth:`Guard.answer_json` and
:class:`gateway.guardrails._stream.StreamGuard` filter the answer the client receives.
The pseudonym mapping (placeholder → original) lives in the :class:`Guard` only, for
the request's life; nothing of a matched value is logged, counted or put in an error:
only the detector's name, the field's path and character offsets.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry, Counter, Histogram

from gateway.errors import BadRequest
from gateway.guardrails._detect import BY_NAME, DETECTORS, Detector, Finding, scan
from gateway.guardrails._rules import vet
from gateway.guardrails._settings import DEFAULT_ACTIONS, Action, GuardrailSettings

log = logging.getLogger("mayu.guardrails")


class GuardrailBlocked(BadRequest):
    """Blocked by a guardrail."""

    code = "guardrail_blocked"

    def __init__(self, detector: str, path: str, *, answer: bool = False) -> None:
        what, rest = (("the answer", "the match was not relayed") if answer
                      else ("the request", "nothing was sent upstream"))
        super().__init__(f"{what} was blocked by the guardrail {detector!r} (found in "
                         f"{path}); {rest}", param=path)
        self.detector = detector


@dataclass(frozen=True, slots=True)
class Policy:
    """A team's guardrails, compiled: the detectors that act, and how."""

    detectors: tuple[Detector, ...]
    actions: dict[str, Action]
    answers: bool
    holdback: int
    max_hold: int


_POLICIES: dict[tuple[int, tuple[str, ...]], tuple[GuardrailSettings, Policy | None]] = {}


def policy_for(settings: GuardrailSettings, profiles: tuple[str, ...]) -> Policy | None:
    """The compiled policy of a team naming ``profiles`` (None: not guarded)."""
    key = (id(settings), profiles)
    hit = _POLICIES.get(key)
    if hit is not None and hit[0] is settings:
        return hit[1]
    policy = _compile(settings, profiles) if settings.enabled or profiles else None
    _POLICIES[key] = (settings, policy)
    return policy


def _compile(settings: GuardrailSettings, profiles: tuple[str, ...]) -> Policy:
    actions: dict[str, Action] = {**DEFAULT_ACTIONS, **settings.actions}
    rules = list(settings.rules)
    for name in profiles:
        profile = settings.profiles.get(name)
        if profile is None:
            log.warning("a team names the guardrail profile %r, which is not configured: "
                        "the org-wide guardrails apply", name)
            continue
        actions.update(profile.actions)
        rules += profile.rules
    dets = [d for d in DETECTORS if actions.get(d.name, "off") != "off"]
    if settings.presidio is not None:  # its findings act through these (_presidio.py)
        p = settings.presidio
        actions.update({detector_name(e): p.actions.get(e, p.action) for e in p.entities})
    for rule in rules:
        if rule.action != "off":
            actions[rule.name] = rule.action
            dets.append(Detector(rule.name, rule.kind, vet(rule.pattern), group=0,
                                 placeholder=rule.name.upper()))
    return Policy(tuple(dets), actions, settings.answers, settings.holdback_chars,
                  settings.max_hold_chars)


class GuardMetrics:
    """``mayu_guardrails_*`` counters (labels: detector, action, direction; bounded by
    the built-in detectors and the configured rule names)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["detector", "action", "direction"]
        self.detected = Counter("mayu_guardrails_detected", "Guardrail findings by "
                                "detector, action and direction.", labels, registry=registry)
        self.pii = Counter("mayu_guardrails_pii_detected", "PII findings (ADR-050).",
                           labels, registry=registry)
        self.injection = Counter("mayu_guardrails_injection_blocked", "Prompt-injection "
                                 "findings that blocked a request (ADR-050).",
                                 ["direction"], registry=registry)
        self.blocked = Counter("mayu_guardrails_blocked", "Requests and answers blocked "
                               "by a guardrail.", ["detector", "direction"],
                               registry=registry)
        self.scanned = Counter("mayu_guardrails_scanned_chars", "Characters scanned.",
                               ["direction"], registry=registry)
        self.webhook = Counter("mayu_guardrails_webhook", "Webhook checker verdicts "
                               "(allow, block, failed_open, failed_closed).", ["outcome"],
                               registry=registry)
        self.presidio = Histogram("mayu_guardrails_presidio_seconds", "Presidio analysis "
                                  "time per request (outcome: ok, failed_open, "
                                  "failed_closed).", ["outcome"], registry=registry,
                                  buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))


_METRICS: dict[int, tuple[CollectorRegistry, GuardMetrics]] = {}


def metrics_for(registry: CollectorRegistry) -> GuardMetrics:
    hit = _METRICS.get(id(registry))
    if hit is None or hit[0] is not registry:
        hit = (registry, GuardMetrics(registry))
        _METRICS[id(registry)] = hit
    return hit[1]


# -- where text is --------------------------------------------------------------------------

SKIP_KEYS = frozenset({
    "model", "role", "type", "id", "object", "tool_call_id", "call_id", "tool_use_id",
    "previous_response_id", "item_id", "signature", "encrypted_content", "media_type",
    "encoding_format", "cache_control", "tool_choice", "finish_reason", "stop_reason",
    "status", "service_tier", "reasoning_effort", "system_fingerprint", "logprobs",
})
"""Keys whose string values are identifiers or enums of the protocols, never text."""

TextFn = Callable[[str, str], str]
"""(text, path) → the text to keep."""


def walk(value: Any, fn: TextFn, path: str = "") -> Any:
    """``value`` with ``fn`` applied to every text string in it (every ingress's shapes:
    messages and their content parts, ``system`` strings and blocks, Responses ``input``
    strings and items, tool descriptions and schemas, tool-call arguments and inputs,
    tool results), returned as a new value only where something changed."""
    if isinstance(value, str):
        return fn(value, path or "$") if value else value
    if isinstance(value, list):
        out = None
        for i, item in enumerate(value):
            new = walk(item, fn, f"{path}[{i}]")
            if new is not item:
                out = out if out is not None else list(value)
                out[i] = new
        return value if out is None else out
    if isinstance(value, dict):
        binary = value.get("type") == "base64"
        changed: dict[str, Any] | None = None
        for key, item in value.items():
            if key in SKIP_KEYS or (binary and key == "data"):
                continue
            if key == "url" and isinstance(item, str) and item.startswith("data:"):
                continue  # an inline image or file, base64
            name = key if _SAFE_KEY.fullmatch(key) else "*"  # a path never carries data
            new = walk(item, fn, f"{path}.{name}" if path else name)
            if new is not item:
                changed = changed if changed is not None else dict(value)
                changed[key] = new
        return value if changed is None else changed
    return value


_SAFE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}")
_PLACEHOLDER = re.compile(r"\[[A-Z][A-Z0-9_]{0,40}_\d{1,6}\]")


@dataclass(eq=False)
class Guard:
    """One request's guard (its pseudonyms live here, in memory, for its life only)."""

    policy: Policy
    request_id: str
    metrics: GuardMetrics | None = None
    pseudonyms: dict[str, str] = field(default_factory=dict)
    """Placeholder → original value."""
    _issued: dict[tuple[str, str], str] = field(default_factory=dict)
    findings: int = 0

    # -- requests ---------------------------------------------------------------------

    def request_text(self, text: str, path: str) -> str:
        """A request's text with its findings acted on (raises GuardrailBlocked)."""
        return self._apply(text, path, "request", self._findings(text, "request"))

    def act(self, text: str, path: str, found: list[Finding]) -> str:
        """A request's text with a plug-in's findings (non-overlapping, in text order)
        acted on like the built-ins' (raises GuardrailBlocked)."""
        return self._apply(text, path, "request", found)

    def _findings(self, text: str, direction: str) -> list[Finding]:
        if self.metrics is not None:
            self.metrics.scanned.labels(direction).inc(len(text))
        dets = self.policy.detectors
        if direction == "answer":
            dets = tuple(d for d in dets if d.kind != "injection")
        return scan(text, dets)

    def _apply(self, text: str, path: str, direction: str, found: list[Finding],
               offset: int = 0) -> str:
        if not found:
            return text
        parts: list[str] = []
        at = 0
        for f in found:
            action = self.policy.actions.get(f.detector, "mask")
            if direction == "answer" and action == "pseudonymize":
                action = "monitor"  # the client owns what it sent; a new value is noted
            self._count(f, action, direction, path, offset)
            if action == "block":
                raise GuardrailBlocked(f.detector, path, answer=direction == "answer")
            if action == "monitor":
                continue
            parts.append(text[at:f.start])
            parts.append(self._placeholder(f, text[f.start:f.end], action))
            at = f.end
        parts.append(text[at:])
        return "".join(parts)

    def _count(self, f: Finding, action: str, direction: str, path: str,
               offset: int) -> None:
        self.findings += 1
        log.info("request %s: guardrail %s %s %s at %s[%d:%d]", self.request_id,
                 f.detector, action, direction, path, offset + f.start, offset + f.end)
        m = self.metrics
        if m is None:
            return
        m.detected.labels(f.detector, action, direction).inc()
        if f.kind == "pii":
            m.pii.labels(f.detector, action, direction).inc()
        if action == "block":
            m.blocked.labels(f.detector, direction).inc()
            if f.kind == "injection":
                m.injection.labels(direction).inc()

    def _placeholder(self, f: Finding, value: str, action: str) -> str:
        label = _label(f.detector)
        if action != "pseudonymize":
            return f"[{label}]"
        key = (label, value)
        ph = self._issued.get(key)
        if ph is None:
            ph = f"[{label}_{len(self._issued) + 1}]"
            self._issued[key] = ph
            self.pseudonyms[ph] = value
        return ph

    # -- answers ----------------------------------------------------------------------

    def answer_text(self, text: str, path: str, offset: int = 0) -> str:
        """An answer's text: findings acted on (mask, block), then pseudonyms restored."""
        if self.policy.answers:
            text = self._apply(text, path, "answer", self._findings(text, "answer"), offset)
        return self.restore(text)

    def restore(self, text: str) -> str:
        if not self.pseudonyms or "[" not in text:
            return text
        return _PLACEHOLDER.sub(lambda m: self.pseudonyms.get(m.group(0), m.group(0)), text)

    @property
    def filters_answers(self) -> bool:
        return self.policy.answers or bool(self.pseudonyms)

    def answer_json(self, data: bytes) -> bytes:
        """A JSON answer's body with every text string filtered (raises GuardrailBlocked)."""
        if not self.filters_answers:
            return data
        try:
            doc = msgspec.json.decode(data)
        except msgspec.DecodeError:
            return data
        new = walk(doc, self.answer_text)
        return data if new is doc else msgspec.json.encode(new)


def detector_name(entity: str) -> str:
    """A Presidio entity type's detector name: ``CREDIT_CARD`` → ``presidio_credit_card``."""
    return f"presidio_{entity.lower()}"


def _label(detector: str) -> str:
    det = BY_NAME.get(detector)
    return det.label if det is not None else detector.upper()


def screen(settings: GuardrailSettings, profiles: tuple[str, ...], doc: dict[str, Any],
           body: bytes, *, request_id: str, registry: CollectorRegistry | None
           ) -> tuple[dict[str, Any], bytes, Guard | None]:
    """The request's body as it may leave the gateway: ``(doc, body, guard)`` — the
    same objects and no guard when the team is not guarded. Raises GuardrailBlocked
    (nothing admitted, nothing charged) when a ``block`` detector finds something."""
    if not settings.enabled and not profiles:
        return doc, body, None
    policy = policy_for(settings, profiles)
    if policy is None:
        return doc, body, None
    guard = Guard(policy, request_id,
                  metrics_for(registry) if registry is not None else None)
    new = walk(doc, guard.request_text)
    if new is doc:
        return doc, body, guard
    return new, msgspec.json.encode(new), guard
