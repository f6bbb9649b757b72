"""The input side of a request's token bound.

Inline text never turns into more tokens than it has bytes, so the body's byte length
plus what the provider adds to every request (chat template, the tool-use system prompt:
``models[].input_overhead_tokens``) bounds the input of a request that carries all of its
input inline. For OpenAI models, with the optional ``tokenize`` extra, the body's text is
counted with OpenAI's own encoding instead (``gateway.ingress._tokenize``: the exact
count plus a per-string and per-object allowance), and the smaller bound is used. A
body above :data:`INLINE_BYTES` is counted by the attempt in a worker thread
(:func:`off_loop`) rather than here, so a 75 KB Codex body does not hold the event loop.

Some requests make the provider add input the body does not carry: a previous response
or conversation (Responses API), an ``item_reference`` to a stored item, uploaded files,
images fetched by URL, documents by URL or file id, server-side tools (web search, file
search, code execution, MCP servers) whose results are fed back as input. Their input
can be any size up to the model's context window, so for them the bound is the model's
``max_input_tokens``; a model without one refuses them (400 naming the config key)
rather than admit a request whose cost it cannot bound.

:func:`input_classes` decides which price classes those input tokens can be billed in,
from the protocol's caching rules (each rule cites its provider page; ``docs/bounds.md``
gives the reasoning and the measured effect), so the µUSD bound prices input at the
dearest class the request can really produce, not at the dearest class there is.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.config import ModelSettings
from gateway.errors import BadRequest
from gateway.ingress._tokenize import encoding_name, input_ceiling
from gateway.usage import Endpoint

INLINE_BYTES = 8 * 1024
"""OpenAI bodies up to this size are counted on the event loop (at most ~0.2 ms), larger
ones in a worker thread (:func:`off_loop`), whose handoff alone costs ~60 µs of CPU
(``tests/bench/refine.py --tokenizer``, docs/bounds.md)."""

_REFERENCE_KEYS = ("previous_response_id", "conversation", "file_id", "container",
                   "vector_store_ids", "mcp_servers")
_URL_KEYS = ("url", "image_url", "file_url", "document_url")
_CLIENT_TOOL_TYPES = ("function", "custom")
_EMPTY: tuple[Any, ...] = (None, "", [], {})
_CONTAINERS = (dict, list)
_CHECKED = frozenset((*_REFERENCE_KEYS, *_URL_KEYS, "prompt", "source", "tools", "type"))
"""The keys whose presence can make a dict add input (a dict with none of them can only
hold such a part deeper down)."""


def _is_remote_url(value: Any) -> bool:
    if isinstance(value, dict):
        value = value.get("url")
    return isinstance(value, str) and value[:8].lower().startswith(("http://", "https://"))


def _tool_reference(tools: Any, path: str) -> str | None:
    """A server-side tool (anything but a client function) adds input the body lacks; a
    ``namespace`` only groups tools (Codex's), so the tools it holds decide."""
    if not isinstance(tools, list):
        return None
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "namespace":
            if (found := _tool_reference(tool.get("tools"), f"{path}[{i}].tools")):
                return found
        elif isinstance(kind, str) and kind not in _CLIENT_TOOL_TYPES:
            return f"{path}[{i}].type={kind}"
    return None


def external_input(node: Any, path: str = "") -> str | None:
    """The path of the first part of the body that makes the provider add input, if any."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            if (found := external_input(item, f"{path}[{i}]")) is not None:
                return found
        return None
    if not isinstance(node, dict):
        return None
    if _CHECKED.isdisjoint(node):
        return _external_below(node, path)
    for key in _REFERENCE_KEYS:
        if node.get(key) not in _EMPTY:
            return f"{path}.{key}".lstrip(".")
    if isinstance(node.get("prompt"), dict) and node["prompt"].get("id"):
        return f"{path}.prompt.id".lstrip(".")
    for key in _URL_KEYS:
        if _is_remote_url(node.get(key)):
            return f"{path}.{key}".lstrip(".")
    source = node.get("source")
    if isinstance(source, dict) and source.get("type") in ("url", "file"):
        return f"{path}.source.type={source['type']}".lstrip(".")
    if (found := _tool_reference(node.get("tools"), f"{path}.tools".lstrip("."))):
        return found
    if node.get("type") == "item_reference":
        return f"{path}.type=item_reference".lstrip(".")
    return _external_below(node, path)


def _external_below(node: dict[str, Any], path: str) -> str | None:
    for key, value in node.items():
        if (isinstance(value, _CONTAINERS) and key != "tools"
                and (found := external_input(value, f"{path}.{key}")) is not None):
            return found
    return None


def input_bound(body: bytes, doc: dict[str, Any], model: ModelSettings, *,
                inline_bytes: int | None = INLINE_BYTES) -> int:
    """The most input tokens this request can be charged for (see the module docstring).

    A body above ``inline_bytes`` is not counted here (the byte bound, until
    :func:`off_loop` counts it in a worker thread); None: count any size here."""
    reason = external_input(doc)
    if reason is None:
        by_bytes = len(body) + model.input_overhead_tokens
        if inline_bytes is not None and len(body) > inline_bytes:
            return by_bytes
        counted = input_ceiling(doc, model)
        return by_bytes if counted is None else min(by_bytes, counted)
    if model.max_input_tokens is None:
        raise BadRequest(
            f"{reason}: this request makes the provider add input the body does not carry, "
            f"so the gateway cannot bound its cost; the operator must set "
            f"models[].max_input_tokens for model {model.name!r} to allow it",
            param=reason.split(".")[0].split("[")[0])
    return max(len(body), model.max_input_tokens)


def choices(doc: dict[str, Any], endpoint: Endpoint) -> int:
    """A chat request's ``n`` (validated by ``_prepare.output_bound``), else 1: its output
    limit is per choice."""
    n = doc.get("n") if endpoint == "chat" else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def counts_off_loop(body: bytes, doc: dict[str, Any], model: ModelSettings) -> bool:
    """Whether :func:`input_bound` left this request's count to :func:`off_loop`: an
    inline body above :data:`INLINE_BYTES` to a model with an OpenAI encoding."""
    return (len(body) > INLINE_BYTES and encoding_name(model) is not None
            and external_input(doc) is None)


async def off_loop(body: bytes, doc: dict[str, Any], model: ModelSettings,
                   bound: int) -> int | None:
    """``bound`` (what :func:`input_bound` gave) lowered to the counted ceiling, when the
    count was left to this step (else None): counted in a worker thread, so the event
    loop serves other requests meanwhile (``encode_ordinary`` releases the GIL while it
    encodes; the body's walk is a small part)."""
    if not counts_off_loop(body, doc, model):
        return None
    counted = await asyncio.to_thread(input_ceiling, doc, model)
    return bound if counted is None else min(bound, counted)


# Anthropic prompt caching
# (https://platform.claude.com/docs/en/build-with-claude/prompt-caching): a cache write
# happens only at a ``cache_control`` breakpoint — on a tool, system or message content
# block, or at the top level of the request ("automatic caching": the breakpoint is placed
# on the last cacheable block) — and lasts 5 minutes unless that ``cache_control`` says
# ``"ttl": "1h"`` (the field's only values are "5m" and "1h"; writes bill 1.25x and 2x
# input). A cache read needs only an earlier write of the same prefix, which another
# request may have made, so a read is possible for any request.
# OpenAI prompt caching (https://developers.openai.com/docs/guides/prompt-caching): automatic
# on every request, "no additional fees"; cached input is billed at the cached rate and
# reported as ``cached_tokens``, and no write count is reported (so ``gateway.usage`` can
# record only input and cache reads for the OpenAI shapes). OpenAI-compatible endpoints
# that front Claude (OpenRouter, Portkey) accept Anthropic's ``cache_control`` on
# OpenAI-shaped bodies and bill writes for it, so a marker widens the OpenAI classes too.
_ALWAYS = frozenset(("input", "cache_read"))
_WRITE_5M = frozenset(("cache_write_5m",))
_WRITE_ANY = frozenset(("cache_write_5m", "cache_write_1h"))


def _marker_ttls(doc: dict[str, Any]) -> frozenset[str]:
    """The write classes the body's ``cache_control`` breakpoints can produce.

    Any ``cache_control`` key counts, wherever it is (a stray one makes the bound dearer,
    never unsound); ``null`` is the schema's "no breakpoint". A dict whose ``ttl`` is
    absent or ``"5m"`` writes 5m; anything else (``"1h"``, a TTL this gateway does not
    know, a value that is not an object) may write 1h, the dearer class.
    """
    found: frozenset[str] = frozenset()
    stack: list[Any] = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        marker = node.get("cache_control")
        if marker is not None:
            five = isinstance(marker, dict) and marker.get("ttl", "5m") == "5m"
            found |= _WRITE_5M if five else _WRITE_ANY
            if found == _WRITE_ANY:
                return found
        stack.extend(v for v in node.values() if isinstance(v, _CONTAINERS))
    return found


def input_classes(doc: dict[str, Any]) -> frozenset[str]:
    """The price classes this request's input tokens can be billed in (rules above).

    Input and cache reads always; a 5m cache write only with a ``cache_control``
    breakpoint, a 1h write only with one whose TTL may be 1h. One rule serves every
    endpoint: OpenAI's own bodies carry no markers, so they get input and reads only.
    Writes of a request without a 1h marker that the upstream reports without the TTL
    split (``cache_write_unknown``) are 5m writes all the same (the provider bills the TTL
    the breakpoint asked for), so the bound does not add the 1h class for them;
    ``docs/bounds.md`` says what that means for the settlement's liability.
    """
    return _ALWAYS | _marker_ttls(doc)
