"""Refining a request's input bound with the provider's own token count (issue 26).

The byte bound (``gateway.ingress._bounds.input_bound``: every body byte a token) is
cheap and sound, but it overstates an agent's input several-fold: a Claude Code turn
carries 20–60 KB of system prompt and tools as JSON, so at Opus prices a small budget
cannot hold one turn. When it matters — the admission refused a money or token-quota
charge (``refine_input: on_shortfall``, the default), or before every admission
(``always``) — the input side is bounded instead by the deployment's own count
(``gateway.providers.TokenCounter``: Anthropic ``count_tokens``) plus an allowance:

    counted bound = count + max(64, ceil(count × models[].count_allowance_pct / 100))
                          (+ models[].input_overhead_tokens when the request has tools)

Anthropic documents the count as an estimate that "may differ by a small amount" from
what the message bills, and that it may include system-added tokens that are not billed
(an over-count, harmless here); the allowance covers the first. Server tools, MCP
servers, files and URLs make the provider add input the count does not see: such requests
(``_bounds.external_input``) keep their context-window bound and are never counted.

**Cache.** Counts are kept per process in an LRU of ``server.refine_cache_entries``,
keyed by a chain of hashes: one over (deployment, upstream model, model, the client's
``anthropic-beta`` header, system, tools, tool_choice, thinking), then one more per
message, ``cache_control`` markers left out (the count ignores them; Claude Code moves
its last breakpoint every turn). A request whose
whole chain is cached is bounded by that count at once. A request that extends a counted
one (a session's next turn re-sends the counted prefix and appends messages) is bounded
by the prefix's counted bound plus the appended messages' JSON bytes (no tokenizer makes
more tokens than bytes; each message's JSON framing is longer than its role framing):
no count call — unless the appended messages hold an image or a document (a compressed
PDF page can bill more tokens than its bytes), which are always counted. Only if that
bound is still refused is the whole request counted.

**Failure.** A count that fails or takes longer than ``server.refine_timeout_s`` leaves
the byte bound (sound) in force, said in the log, the answer's ``x-inferplane-input-bound``
header and a refusal's message. A request's refined bound belongs to the deployment that
counted it: a fallback attempt on another deployment starts again from the byte bound.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.config import Deployment
from gateway.governance import BYTE, COUNTED, FAILED, PREFIX, Bounds
from gateway.ingress._bounds import external_input
from gateway.providers import CountFailed, Provider, TokenCounter, count_body

if TYPE_CHECKING:
    from gateway.ingress._attempt import Call

log = logging.getLogger("mayu.ingress")

__all__ = ["BYTE", "COUNTED", "FAILED", "PREFIX", "CountCache", "Counting", "Refined",
           "Refiner",
           "allowance", "count_scope", "mode_of", "note_admitted", "prefix_chain", "refine",
           "tool_prompt"]

MIN_ALLOWANCE = 64
"""Tokens added to any count, however small (the allowance's floor)."""

_PREFIX_FIELDS = ("system", "tools", "tool_choice", "thinking")


def allowance(count: int, pct: int) -> int:
    """What is added to a provider's count of ``count`` tokens (module docstring)."""
    return max(MIN_ALLOWANCE, -(-count * pct // 100))


def tool_prompt(call: Call) -> int:
    """``models[].input_overhead_tokens`` for a request with tools, else 0.

    With ``tools`` Anthropic adds a tool-use system prompt (up to 530 tokens for the
    models its *Tool use pricing* page lists); the *Token counting* page does not say
    whether its count includes it, so the bound adds the model's overhead setting."""
    tools = call.doc.get("tools")
    return call.model.input_overhead_tokens if isinstance(tools, list) and tools else 0


_MEDIA = frozenset(("image", "document"))


def _has_media(node: Any) -> bool:
    """Whether ``node`` holds an image or document block: a page of a compressed PDF can
    bill more tokens than its bytes, so appended media are counted, never byte-bounded."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("type") in _MEDIA:
                return True
            stack.extend(v for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _unmarked(node: Any) -> Any:
    """``node`` without its ``cache_control`` keys (they change no count)."""
    if isinstance(node, dict):
        return {k: _unmarked(v) for k, v in node.items() if k != "cache_control"}
    if isinstance(node, list):
        return [_unmarked(v) for v in node]
    return node


def prefix_chain(doc: dict[str, Any], *, scope: str) -> list[bytes]:
    """``[h0, h1, …, hn]``: h0 hashes ``scope`` (deployment and models) and the request's
    fixed parts, each next one also the next message (``cache_control`` left out)."""
    head = hashlib.blake2b(scope.encode(), digest_size=16)
    head.update(msgspec.json.encode(_unmarked({k: doc.get(k) for k in _PREFIX_FIELDS})))
    chain = [head.digest()]
    messages = doc.get("messages")
    for message in messages if isinstance(messages, list) else []:
        step = hashlib.blake2b(chain[-1], digest_size=16)
        step.update(msgspec.json.encode(_unmarked(message)))
        chain.append(step.digest())
    return chain


@dataclass(frozen=True)
class Refined:
    """A refined input bound and how it was had."""

    tokens: int
    basis: str
    note: str
    outcome: str
    """``mayu_input_refinements_total``'s outcome label: cached, counted_prefix, counted,
    failed."""


class CountCache:
    """Counted bounds by prefix-chain hash, least recently used dropped first."""

    def __init__(self, *, entries: int) -> None:
        self._entries = entries
        self._counts: OrderedDict[bytes, int] = OrderedDict()

    def put(self, key: bytes, tokens: int) -> None:
        if self._entries <= 0:
            return
        self._counts[key] = tokens
        self._counts.move_to_end(key)
        while len(self._counts) > self._entries:
            self._counts.popitem(last=False)

    def longest(self, chain: list[bytes]) -> tuple[int, int] | None:
        """(k, counted bound) of the longest cached prefix ``chain[k]`` (k ≥ 1), or None."""
        for k in range(len(chain) - 1, 0, -1):
            tokens = self._counts.get(chain[k])
            if tokens is not None:
                self._counts.move_to_end(chain[k])
                return k, tokens
        return None


def mode_of(call: Call, deployment: Deployment) -> str:
    return deployment.refine_input or call.model.refine_input


def count_scope(call: Call, deployment: Deployment) -> str:
    """What a count depends on besides the body: where and as which model it was
    counted, and the client's ``anthropic-beta`` header (forwarded to the count; a beta
    can change how a request is tokenized). A refined bound belongs to this scope."""
    beta = call.client_headers.get("anthropic-beta", "")
    return (f"{deployment.provider}\0{deployment.upstream_model or ''}\0{call.model.name}"
            f"\0{beta}")


class Refiner:
    """Counts with the provider and caches (one per gateway process)."""

    def __init__(self, *, timeout_s: float, entries: int) -> None:
        self.timeout_s = timeout_s
        self.cache = CountCache(entries=entries)

    def eligible(self, call: Call, deployment: Deployment, provider: Provider) -> bool:
        """Whether this attempt's input bound may be refined by a count at all."""
        return (call.endpoint == "messages" and mode_of(call, deployment) != "off"
                and isinstance(provider, TokenCounter) and provider.counts_tokens
                and external_input(call.doc) is None)

    async def tighter(self, call: Call, deployment: Deployment, provider: Provider, *,
                      bounds: Bounds | None = None, cached: bool = True) -> Refined | None:
        """The next tighter input bound than ``bounds`` (default the call's): cached or
        prefix-extended first, unless ``cached`` is False, then a count call; None when
        there is none (the bound is counted already, or a count was asked for it)."""
        bounds = bounds or call.bounds
        if bounds.input_basis in (COUNTED, FAILED) or bounds.counted:
            return None
        chain = prefix_chain(call.doc, scope=count_scope(call, deployment))
        if cached and bounds.input_basis == BYTE:
            hit = self.cache.longest(chain)
            if hit is not None:
                k, bound = hit
                if k == len(chain) - 1:
                    return Refined(bound, COUNTED, "counted by the provider (cached)",
                                   "cached")
                tail = call.doc["messages"][k:]
                if not _has_media(tail):
                    appended = len(msgspec.json.encode(tail))
                    return Refined(bound + appended, PREFIX,
                                   f"counted prefix of {k} messages + {appended} bytes "
                                   "appended since", "counted_prefix")
        return await self._count(call, deployment, provider, chain[-1], bounds)

    async def _count(self, call: Call, deployment: Deployment, provider: Provider,
                     key: bytes, bounds: Bounds) -> Refined:
        assert isinstance(provider, TokenCounter)
        body = count_body(call.doc, model=deployment.upstream_model or call.model.name)
        try:
            async with asyncio.timeout(self.timeout_s):
                count = await provider.count_input_tokens(body, headers=call.client_headers)
        except (CountFailed, TimeoutError) as exc:
            why = str(exc) or f"no answer within server.refine_timeout_s={self.timeout_s}"
            log.warning("request %s: input bound not refined, the byte bound stands: %s",
                        call.request_id, why)
            return Refined(bounds.byte_input, FAILED,
                           "bounded by the body's bytes: the provider's token count failed",
                           "failed")
        extra, tools = allowance(count, call.model.count_allowance_pct), tool_prompt(call)
        bound = count + extra + tools
        self.cache.put(key, bound)
        return Refined(bound, COUNTED, f"counted by the provider: {count} + {extra} "
                       f"allowance{f' + {tools} tool-use prompt' if tools else ''}",
                       "counted")


async def refine(call: Call, deployment: Deployment, provider: Provider, *,
                 refused: bool, bounds: Bounds | None = None) -> Bounds | None:
    """The attempt's input bound tightened one step if its mode asks now (``always``
    before the first admission; either mode after a money or quota refusal): the new
    bounds, or None when nothing changed. New bounds may have the same input (a count
    that failed says so in the basis, one that came out higher marks the bound counted):
    only a lower input is a tighter bound. A count is asked at most once per deployment.
    ``bounds``: the ones to tighten (default the call's)."""
    if not refused and mode_of(call, deployment) != "always":
        return None  # the common case: nothing to do, not even the eligibility walk
    refiner = call.gw.refiner
    if refiner is None or not refiner.eligible(call, deployment, provider):
        return None
    metrics = call.gw.metrics
    before = bounds = bounds or call.bounds
    cached = True
    while True:
        start = time.perf_counter()
        refined = await refiner.tighter(call, deployment, provider, bounds=bounds,
                                        cached=cached)
        if refined is None:
            break
        labels = (deployment.provider, refined.outcome)
        metrics.child(metrics.input_refinements, *labels).inc()
        metrics.child(metrics.input_refinement_latency, *labels).observe(
            time.perf_counter() - start)
        bounds = bounds.with_input(refined.tokens, refined.basis, refined.note)
        if bounds.input_tokens < before.input_tokens:
            break
        cached = False  # a cached or prefix bound no lower than this one: count next
    return None if bounds == before else bounds


@dataclass(frozen=True, slots=True)
class Counting:
    """One attempt's input count, for the Governor's shortfalls
    (:class:`gateway.governance.Refinement`): its deployment's provider, its body."""

    call: Call
    deployment: Deployment
    provider: Provider

    async def tighter(self, bounds: Bounds) -> Bounds | None:
        return await refine(self.call, self.deployment, self.provider, refused=True,
                            bounds=bounds)


def note_admitted(call: Call, deployment: Deployment, provider: Provider) -> None:
    """Count an admission on the byte bound by a deployment that could have counted
    (``not_needed``): with the refinements, the share of admissions that needed one. A
    request the provider adds input to is never counted, and is among these too (the
    walk that tells it apart is not worth its CPU on every admission)."""
    if (call.bounds.input_basis != BYTE or call.bounds.counted
            or call.endpoint != "messages"
            or not isinstance(provider, TokenCounter) or not provider.counts_tokens
            or mode_of(call, deployment) == "off"):
        return
    metrics = call.gw.metrics
    metrics.child(metrics.input_refinements, deployment.provider, "not_needed").inc()
