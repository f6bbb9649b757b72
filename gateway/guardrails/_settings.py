"""The ``guardrails:`` block of the gateway settings (docs/guardrails.md).

Off by default. ``enabled: true`` guards every team with the org-wide ``actions`` and
``rules``; a team whose ``guardrails`` list names profiles (``mayu teams``/the admin API)
is guarded by the org block overlaid with those profiles, in order, even when the org
block is off. A tenant regex is refused at load unless it is linear-time safe
(:func:`gateway.guardrails._rules.vet`), naming its key.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

Action = Literal["off", "monitor", "mask", "pseudonymize", "block"]

DEFAULT_ACTIONS: dict[str, Action] = {
    "email": "mask", "phone": "mask", "ssn": "mask", "iban": "mask", "card": "mask",
    "ip": "monitor", "jwt": "mask", "private_key": "mask", "aws_key": "mask",
    "github_token": "mask", "openai_key": "mask", "anthropic_key": "mask",
    "generic_secret": "mask", "prompt_injection": "block",
}
"""Each built-in detector's action when ``actions`` does not name it."""


class _Base(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class GuardrailWebhook(_Base, frozen=True):
    """The operator's checker (``gateway/guardrails/_webhook.py``)."""

    url: Annotated[str, msgspec.Meta(pattern=r"^https?://")]
    failure: Literal["open", "closed"]
    """What a checker that does not answer means: let the request through, or refuse it
    (required, no default)."""
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=30)] = 2.0


class GuardrailPresidio(_Base, frozen=True):
    """The Presidio plug-in (``gateway/guardrails/_presidio.py``; the ``presidio`` extra)."""

    model: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,99}$")]
    """An installed spaCy pipeline package (``en_core_web_sm``...), or ``blank``: no NER
    model, Presidio's pattern recognizers only (cards, IBANs, emails, phones, ...)."""
    failure: Literal["open", "closed"]
    """What an analysis that fails or outlasts ``timeout_s`` means (no default)."""
    language: Annotated[str, msgspec.Meta(pattern=r"^[a-z]{2,3}$")] = "en"
    entities: tuple[Annotated[str, msgspec.Meta(pattern=r"^[A-Z][A-Z0-9_]{0,39}$")], ...] = (
        "CREDIT_CARD", "IBAN_CODE", "EMAIL_ADDRESS", "PHONE_NUMBER", "IP_ADDRESS",
        "CRYPTO", "US_SSN", "PERSON", "LOCATION")
    """The Presidio entity types looked for (each is the detector ``presidio_<entity>``)."""
    score_threshold: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.5
    action: Action = "mask"
    actions: dict[str, Action] = {}
    """Per entity, over ``action``."""
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=30)] = 2.0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.actions) - set(self.entities))
        if unknown:
            raise ValueError(f"actions names {unknown[0]!r}, which is not in entities")
        from gateway.guardrails._presidio import check_installed  # imports nothing heavy
        check_installed(self.model)


class GuardrailRule(_Base, frozen=True):
    """A tenant's own pattern: found like a built-in detector, masked as ``[NAME]``."""

    name: Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_]{0,39}$")]
    pattern: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    action: Action = "mask"
    kind: Literal["pii", "secret", "injection"] = "pii"

    def __post_init__(self) -> None:
        from gateway.guardrails._rules import vet  # the engine loads only when used
        vet(self.pattern)


class GuardrailProfile(_Base, frozen=True):
    actions: dict[str, Action] = {}
    rules: list[GuardrailRule] = []

    def __post_init__(self) -> None:
        from gateway.guardrails._detect import NAMES
        unknown = sorted(set(self.actions) - set(NAMES))
        if unknown:
            raise ValueError(f"unknown detector {unknown[0]!r} (known: {', '.join(NAMES)})")


class GuardrailSettings(GuardrailProfile, frozen=True):
    enabled: bool = False
    """Guard every team with this block (false: only teams that name a profile)."""
    answers: bool = True
    """Scan the answers too (JSON and streamed): mask, block, and restore pseudonyms."""
    holdback_chars: Annotated[int, msgspec.Meta(ge=16, le=4096)] = 16
    """A stream's text held back per channel beyond what the cut rules hold (a run of
    non-blank characters, a number's digit groups, an open private-key block: held
    whole, up to ``max_hold_chars``); raise it for tenant patterns with spaces."""
    max_hold_chars: Annotated[int, msgspec.Meta(ge=256, le=1_048_576)] = 32_768
    profiles: dict[str, GuardrailProfile] = {}
    webhook: GuardrailWebhook | None = None
    """Ask the operator's checker too, after the built-in detectors (guarded teams)."""
    presidio: GuardrailPresidio | None = None
    """Microsoft Presidio too, after the built-in detectors (guarded teams' requests)."""
