"""A deterministic, provider-free token estimate of a request's prompt text.

Used by ``/v1/messages/count_tokens`` (answered locally, no provider call) and by the
mock model, so the two agree. Roughly four UTF-8 bytes per token; never below one.
"""

from __future__ import annotations

from typing import Any

# Fields of a request body whose string values are prompt text (not model names,
# ids or parameters).
_TEXT_FIELDS = ("messages", "input", "system", "prompt", "instructions", "tools")


# Structural keys whose values are labels, not text the model reads as prompt.
_LABELS = frozenset({"role", "type", "cache_control", "id", "tool_use_id"})


def text_strings(value: Any) -> list[str]:
    """Every string in a JSON value but the values of label fields (role, type, ids)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() if k not in _LABELS for s in text_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in text_strings(v)]
    return []


def prompt_text(body: dict[str, Any]) -> str:
    """All prompt text of a request body, concatenated."""
    return "".join(s for field in _TEXT_FIELDS for s in text_strings(body.get(field)))


def estimate_tokens(text: str) -> int:
    return max(1, len(text.encode("utf-8")) // 4)
