"""Mapping each protocol's usage object onto :class:`gateway.pricing.Usage`.

Upstream usage is untrusted input: a class that is not an integer, is negative or is
absurdly large raises :class:`gateway.pricing.InvalidUsage` (settled INVALID, never
committed). A missing usage object, or one without the counts every response of its
protocol carries (input and output tokens), maps to ``None`` (settled UNCERTAIN: bounds
kept) — ``"usage": {}`` must never read as a free request. ``null`` for an optional
class means "none of that class" (Anthropic sends ``cache_creation_input_tokens: null``
when caching is not used).
"""

from __future__ import annotations

from typing import Any

from gateway.pricing import InvalidUsage, Usage


def _count(obj: Any, field: str, *, where: str) -> int:
    """One token count: absent or null is 0; anything not a plain int is invalid."""
    if not isinstance(obj, dict):
        return 0
    value = obj.get(field)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidUsage(f"{where}.{field} is not an integer: {value!r}")
    if value < 0:
        raise InvalidUsage(f"{where}.{field} is negative: {value}")
    return value


def _has(usage: dict[str, Any], *fields: str) -> bool:
    """Whether every required count is present (not absent, not null)."""
    return all(usage.get(f) is not None for f in fields)


def _cached_within(usage: dict[str, Any], input_field: str, output_field: str | None,
                   details: str) -> Usage | None:
    """OpenAI's shape: the input count includes ``<details>.cached_tokens``."""
    inp = _count(usage, input_field, where="usage")
    output = 0 if output_field is None else _count(usage, output_field, where="usage")
    cached = _count(usage.get(details), "cached_tokens", where=f"usage.{details}")
    if cached > inp:
        raise InvalidUsage(f"usage.{details}.cached_tokens ({cached}) exceeds "
                           f"usage.{input_field} ({inp})")
    required = (input_field,) if output_field is None else (input_field, output_field)
    if not _has(usage, *required):
        return None
    return Usage(input=inp - cached, output=output, cache_read=cached).validate()


def from_openai(usage: Any, *, embeddings: bool = False) -> Usage | None:
    """Chat completions and embeddings: ``prompt_tokens`` includes the cached part.

    Embeddings report no completion tokens; chat must report them.
    """
    if not isinstance(usage, dict):
        return None
    return _cached_within(usage, "prompt_tokens", None if embeddings else "completion_tokens",
                          "prompt_tokens_details")


def from_responses(usage: Any) -> Usage | None:
    """Responses API: ``input_tokens`` includes ``input_tokens_details.cached_tokens``."""
    if not isinstance(usage, dict):
        return None
    return _cached_within(usage, "input_tokens", "output_tokens", "input_tokens_details")


def from_anthropic(usage: Any) -> Usage | None:
    """Messages API: input excludes cache reads and writes; writes split by TTL.

    Cache writes the upstream did not attribute to a TTL (no ``cache_creation`` split, or
    a split that covers less than ``cache_creation_input_tokens``) are counted as
    ``cache_write_unknown``: tokens known, price uncertain.
    """
    if not isinstance(usage, dict):
        return None
    written = _count(usage, "cache_creation_input_tokens", where="usage")
    split = usage.get("cache_creation")
    w5 = _count(split, "ephemeral_5m_input_tokens", where="usage.cache_creation")
    w1 = _count(split, "ephemeral_1h_input_tokens", where="usage.cache_creation")
    if isinstance(split, dict) and w5 + w1 > written:
        # The split is more detailed than the total; trust the detail.
        written = w5 + w1
    inp = _count(usage, "input_tokens", where="usage")
    output = _count(usage, "output_tokens", where="usage")
    if not _has(usage, "input_tokens", "output_tokens"):
        return None
    return Usage(
        input=inp, output=output,
        cache_read=_count(usage, "cache_read_input_tokens", where="usage"),
        cache_write_5m=w5, cache_write_1h=w1, cache_write_unknown=written - w5 - w1,
    ).validate()
