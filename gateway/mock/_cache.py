"""The mock upstream's prompt cache: what a server-side cache bills, per deployment.

Off by default (the stateless mock reports half of every ``cache_control`` block as a
read and half as a write, whatever came before). ``mayu mock-upstream --prompt-cache``
keeps one cache per process — one process stands for one deployment (a region, an
inference profile) — and bills a Messages request as Anthropic does (*Prompt caching*):

- the cacheable prefix ends at a ``cache_control`` breakpoint; the prefix is the request's
  ``tools``, then ``system``, then ``messages`` blocks in order, with the model name;
- the longest prefix already cached (and not expired) is a **read** — looked up at each
  breakpoint and up to 20 block boundaries before it, so the previous turn's breakpoint is
  found after the client moved its breakpoint to the new last message —; the rest
  of the prefix up to the last breakpoint is a **write**, each segment at its breakpoint's
  TTL (``5m``, or ``1h`` when its ``ttl`` says so); everything after it is input;
- a read refreshes the entry's TTL, a write creates every breakpoint prefix's entry.

Only hashes and token counts are kept, never the text. The clock is injectable so a test
can expire entries without waiting.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import msgspec

from gateway.mock._model import Classes, anthropic_classes
from gateway.usage import estimate_tokens
from gateway.usage import text_strings as _strings

TTL_S = {"5m": 300.0, "1h": 3600.0}
LOOKBACK = 20
"""Block boundaries before a breakpoint checked for an earlier turn's entry."""
MAX_ENTRIES = 100_000
"""Entries kept at most (the oldest expiry goes first): a bound on the mock's memory."""


def _blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's prompt blocks in cache order: tools, system, then each message's
    content blocks (a string content is one text block)."""
    out: list[dict[str, Any]] = []
    tools = body.get("tools")
    if isinstance(tools, list):
        out += [t for t in tools if isinstance(t, dict)]
    system = body.get("system")
    if isinstance(system, str):
        out.append({"type": "text", "text": system})
    elif isinstance(system, list):
        out += [b for b in system if isinstance(b, dict)]
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict):
            continue
        content = msg.get("content")
        role = str(msg.get("role", ""))
        if isinstance(content, str):
            out.append({"role": role, "type": "text", "text": content})
        elif isinstance(content, list):
            out += [{"role": role, **b} for b in content if isinstance(b, dict)]
    return out


def _ttl(block: dict[str, Any]) -> str:
    control = block.get("cache_control")
    return "1h" if isinstance(control, dict) and control.get("ttl") == "1h" else "5m"


class PromptCache:
    """Prefix hash → expiry, for one deployment."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[str, float] = {}
        self.skew_s = 0.0
        """Added to the clock (``POST /__mock/clock``: a test moves time forward)."""

    def now(self) -> float:
        return self._clock() + self.skew_s

    def classes(self, body: dict[str, Any]) -> Classes:
        """What this request is billed: the stateless classes' input and output, with
        the cache classes from this cache's state (which the request then updates)."""
        base = anthropic_classes(body)
        prompt = base.input + base.cache_read + base.cache_write_5m + base.cache_write_1h \
            + base.cache_write_unknown
        bounds, points = self._prefixes(body)
        if not points:
            return Classes(input=prompt, output=base.output)
        now = self.now()
        read = self._longest_hit(bounds, points, now)
        w5 = w1 = 0
        done = read
        for index in points:
            tokens, ttl = bounds[index][1], bounds[index][2]
            if tokens <= done:
                continue
            if ttl == "1h":
                w1 += tokens - done
            else:
                w5 += tokens - done
            done = tokens
        for index in points:  # a read refreshes, a write creates: every breakpoint is live
            self._entries[bounds[index][0]] = now + TTL_S[bounds[index][2]]
        self._trim()
        read, w5, w1 = _within(prompt, read, w5, w1)
        return Classes(input=prompt - read - w5 - w1, output=base.output, cache_read=read,
                       cache_write_5m=w5, cache_write_1h=w1)

    def _longest_hit(self, bounds: list[tuple[str, int, str]], points: list[int],
                     now: float) -> int:
        """Tokens of the longest cached prefix: looked up at each breakpoint and at the
        block boundaries up to ``LOOKBACK`` blocks before it, as the provider does."""
        best = 0
        for index in points:
            for j in range(index, max(-1, index - LOOKBACK - 1), -1):
                if self._entries.get(bounds[j][0], 0.0) > now:
                    best = max(best, bounds[j][1])
                    break
        return best

    def _prefixes(self, body: dict[str, Any]) -> tuple[list[tuple[str, int, str]], list[int]]:
        """(prefix hash, prefix tokens, TTL) at every block boundary, and the indices of
        the breakpoints among them."""
        digest = hashlib.sha256(str(body.get("model", "")).encode())
        tokens = 0
        bounds: list[tuple[str, int, str]] = []
        points: list[int] = []
        for block in _blocks(body):
            plain = {k: v for k, v in block.items() if k != "cache_control"}
            digest.update(msgspec.json.encode(plain))
            tokens += estimate_tokens("".join(_strings(plain)))
            if isinstance(block.get("cache_control"), dict):
                points.append(len(bounds))
            bounds.append((digest.copy().hexdigest(), tokens, _ttl(block)))
        return bounds, points

    def _trim(self) -> None:
        if len(self._entries) > MAX_ENTRIES:
            oldest = sorted(self._entries.items(), key=lambda kv: kv[1])
            for key, _ in oldest[:len(self._entries) - MAX_ENTRIES]:
                del self._entries[key]

    def clear(self) -> None:
        self._entries.clear()


def _within(prompt: int, read: int, w5: int, w1: int) -> tuple[int, int, int]:
    """The cache classes, lowered (writes first) so they never exceed the prompt: the
    per-block estimates can round above the whole prompt's."""
    over = read + w5 + w1 - prompt
    for_w1 = min(w1, max(0, over))
    w1, over = w1 - for_w1, over - for_w1
    for_w5 = min(w5, max(0, over))
    w5, over = w5 - for_w5, over - for_w5
    return read - max(0, over), w5, w1
