"""A provider's own input-token count, for refining a request's input bound.

Anthropic's ``POST /v1/messages/count_tokens`` (free, rate-limited separately from
messages) "accepts the same structured list of inputs for creating a message, including
support for system prompts, tools, images, and PDFs" and answers ``{"input_tokens": n}``,
the total input every class together (Anthropic, *Token counting*,
https://platform.claude.com/docs/en/build-with-claude/token-counting). It refuses the
fields only a message has (``max_tokens``, ``stream``, ``metadata``, sampling settings),
so :func:`count_body` keeps only what the count reads.

A provider that can count is a :class:`TokenCounter` (``counts_tokens`` says whether it
does for this kind: the ``anthropic`` kind and the built-in ``mock`` do, ``openai`` has no
such endpoint). Any failure is a :class:`CountFailed`; the caller keeps the byte bound.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import msgspec

COUNT_PATH = "/v1/messages/count_tokens"
COUNTED_FIELDS = ("model", "system", "tools", "tool_choice", "thinking", "messages")
"""The Messages fields ``count_tokens`` accepts that change the count (``mcp_servers``
and server tools make the request add input the body lacks: those requests keep their
context-window bound and are never counted)."""


class CountFailed(Exception):
    """The provider's token count could not be had (error status, bad answer, timeout)."""


@runtime_checkable
class TokenCounter(Protocol):
    @property
    def counts_tokens(self) -> bool:
        """Whether this provider answers ``count_input_tokens`` at all."""

    async def count_input_tokens(self, body: bytes, *, headers: dict[str, str]) -> int:
        """The provider's input-token count of a ``count_body``; raises CountFailed."""


def count_body(doc: dict[str, Any], *, model: str) -> bytes:
    """The ``count_tokens`` request for a Messages body sent upstream as ``model``."""
    body = {k: doc[k] for k in COUNTED_FIELDS if k in doc}
    body["model"] = model
    return msgspec.json.encode(body)


def parse_count(status: int, raw: bytes, *, provider: str) -> int:
    """``input_tokens`` of a count answer; CountFailed for anything else."""
    if status != 200:
        raise CountFailed(f"{provider}: count_tokens answered HTTP {status}")
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise CountFailed(f"{provider}: count_tokens answer is not JSON") from exc
    value = doc.get("input_tokens") if isinstance(doc, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CountFailed(f"{provider}: count_tokens answer has no valid input_tokens")
    return value
