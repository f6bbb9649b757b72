"""The mock model's arithmetic: usage is a pure function of the request body.

Prompt tokens come from the prompt text (``max(1, utf8_len // 4)``); output tokens are
deterministic and never above the request's ``max_tokens`` (or its OpenAI variants).
Cache classes are reported for every protocol so the gateway's pricing of each class is
exercised: OpenAI reports half of a long prompt as ``cached_tokens``; Anthropic reports a
cache read and a cache write for every block that carries ``cache_control`` (1h when its
``ttl`` is ``"1h"``). The sum of all classes never exceeds the body's byte length plus
``max_tokens`` — the gateway's conservative bound.

Special model names (substrings) switch on misbehaviour for tests: ``negative-usage``,
``missing-usage``, ``no-ttl`` (cache writes without the 5m/1h split), ``error-500``,
``slow-stream`` (a long stream with a delay between chunks; a non-streamed answer waits
as long as that stream would take), ``cut-stream`` (the connection breaks after the first
events of a stream, before any usage is reported), ``slow-start`` (the answer — status
and headers included — starts only after a pause), ``hidden-input`` (reports
``HIDDEN_INPUT`` more input tokens than the body holds, as a provider does for a
``previous_response_id`` or a file it adds: only a context-window bound covers it),
``count-error`` (``/v1/messages/count_tokens`` answers 500), ``count-slow`` (it answers
after ``COUNT_SLOW_S``).

:func:`anthropic_count` is the mock's ``/v1/messages/count_tokens``: the sum of the
input classes :func:`anthropic_classes` bills for the same body.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.pricing import Usage
from gateway.usage import estimate_tokens, prompt_text
from gateway.usage import text_strings as _strings

DEFAULT_OUTPUT = 64
"""Output tokens when a request sets no limit (below any sane model ceiling)."""

SLOW_STREAM_CHUNKS = 40
SLOW_STREAM_DELAY_S = 0.1

FLAGS = ("negative-usage", "missing-usage", "no-ttl", "error-500", "slow-stream",
         "cut-stream", "slow-start", "hidden-input", "count-error", "count-slow")
COUNT_SLOW_S = 5.0
HIDDEN_INPUT = 50_000
CUT_AFTER_EVENTS = 2
SLOW_START_S = 2.0


def flags_of(model: str) -> frozenset[str]:
    return frozenset(f for f in FLAGS if f in model)


LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
"""The request fields that limit the output (the protocols' own names)."""


def output_limit(body: dict[str, Any]) -> int:
    """The output the request allows (the first limit field set), else DEFAULT_OUTPUT."""
    for field in LIMIT_FIELDS:
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return DEFAULT_OUTPUT


class Classes(Usage, frozen=True, kw_only=True):
    """The truth the mock reports, per pricing class (Anthropic's convention): a
    :class:`gateway.pricing.Usage`, which the gateway prices (the mock never does)."""

    def as_dict(self) -> dict[str, int]:
        return msgspec.structs.asdict(self)


def _output_tokens(body: dict[str, Any], prompt: int, flags: frozenset[str]) -> int:
    wanted = SLOW_STREAM_CHUNKS if "slow-stream" in flags else 8 + prompt % 24
    return min(output_limit(body), wanted)


def _cache_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every content/system/tool block that carries ``cache_control``."""
    found: list[dict[str, Any]] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("cache_control"), dict):
                found.append(value)
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for field in ("system", "messages", "tools"):
        walk(body.get(field))
    return found


def openai_classes(body: dict[str, Any], *, embeddings: bool = False) -> Classes:
    flags = flags_of(str(body.get("model", "")))
    prompt = estimate_tokens(prompt_text(body)) + (HIDDEN_INPUT if "hidden-input" in flags else 0)
    cached = 0 if embeddings or prompt < 32 else prompt // 2
    output = 0 if embeddings else _output_tokens(body, prompt, flags)
    return Classes(input=prompt - cached, output=output, cache_read=cached)


def anthropic_classes(body: dict[str, Any]) -> Classes:
    flags = flags_of(str(body.get("model", "")))
    prompt = estimate_tokens(prompt_text(body)) + (HIDDEN_INPUT if "hidden-input" in flags else 0)
    read = w5 = w1 = unknown = 0
    for block in _cache_blocks(body):
        tokens = estimate_tokens("".join(_strings(
            {k: v for k, v in block.items() if k != "cache_control"})))
        read += tokens // 2
        write = tokens - tokens // 2
        if "no-ttl" in flags:
            unknown += write
        elif block["cache_control"].get("ttl") == "1h":
            w1 += write
        else:
            w5 += write
    if "no-ttl" in flags and unknown == 0:
        unknown = max(1, prompt // 4)
    cached = read + w5 + w1 + unknown
    return Classes(input=max(0, prompt - cached), output=_output_tokens(body, prompt, flags),
                   cache_read=read, cache_write_5m=w5, cache_write_1h=w1,
                   cache_write_unknown=unknown)


def anthropic_count(body: dict[str, Any]) -> int:
    """What ``/v1/messages/count_tokens`` answers: the input tokens the same body would
    bill, every class together (the mock counts as it bills, so a test can check that a
    bound refined from the count still covers the usage)."""
    c = anthropic_classes(body)
    return c.input + c.cache_read + c.cache_write_5m + c.cache_write_1h + c.cache_write_unknown


def openai_usage(c: Classes, *, embeddings: bool = False,
                 negative: bool = False) -> dict[str, Any]:
    prompt = c.input + c.cache_read
    if embeddings:
        return {"prompt_tokens": prompt, "total_tokens": prompt}
    output = -5 if negative else c.output
    return {"prompt_tokens": prompt, "completion_tokens": output,
            "total_tokens": prompt + output,
            "prompt_tokens_details": {"cached_tokens": c.cache_read, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0}}


def responses_usage(c: Classes, *, negative: bool = False) -> dict[str, Any]:
    prompt = c.input + c.cache_read
    output = -5 if negative else c.output
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": c.cache_read},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output}


def anthropic_usage(c: Classes, *, negative: bool = False) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "input_tokens": c.input, "output_tokens": -5 if negative else c.output,
        "cache_read_input_tokens": c.cache_read,
        "cache_creation_input_tokens": c.cache_write_5m + c.cache_write_1h
        + c.cache_write_unknown}
    if not c.cache_write_unknown:
        usage["cache_creation"] = {"ephemeral_5m_input_tokens": c.cache_write_5m,
                                   "ephemeral_1h_input_tokens": c.cache_write_1h}
    return usage


def output_words(n: int) -> list[str]:
    """``n`` deterministic output words, one token each."""
    return [f"w{i}" for i in range(n)]
