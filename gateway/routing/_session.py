"""A request's session, for cache affinity: which keys name it and how long its cache lives.

The agents' own identity where they send one — Claude Code's ``x-claude-code-session-id``
header (v2.1.86 on; before that ``metadata.user_id``, a JSON object with ``session_id``
or ``user_…_session_<uuid>``), Codex's ``session-id`` / ``session_id`` header, OpenAI's
``prompt_cache_key`` —, else the cacheable prefix: hashes at each block boundary up to the
last ``cache_control`` breakpoint, so the next turn (whose breakpoint moved to its new last
message) finds the previous turn's pin at the boundary where that turn's breakpoint was.
A request with neither has no session. Keys are hashes scoped by model; no payload is kept.
The pin lives as long as the provider's cache: 5 minutes, 1 hour when a breakpoint asks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import msgspec

SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "session_id")
TTL_5M, TTL_1H = 300.0, 3600.0
LOOKBACK = 64
"""Block boundaries before the last breakpoint searched for an earlier turn's pin."""


@dataclass(frozen=True, slots=True)
class Session:
    """The keys to look a pin up by (best first) and the key to pin the answer under."""

    lookup: tuple[str, ...]
    pin: str
    ttl_s: float
    source: str
    """``header``, ``prompt_cache_key``, ``metadata`` or ``prefix`` (for the log)."""


def _scoped(model: str, kind: str, value: str) -> str:
    return hashlib.sha256(f"{model}\0{kind}\0{value}".encode()).hexdigest()[:32]


def _metadata_session(doc: dict[str, Any]) -> str | None:
    meta = doc.get("metadata")
    user = meta.get("user_id") if isinstance(meta, dict) else None
    if not isinstance(user, str) or not user:
        return None
    if user.startswith("{"):
        try:
            parsed = json.loads(user)
        except ValueError:
            return None
        sid = parsed.get("session_id") if isinstance(parsed, dict) else None
        return sid if isinstance(sid, str) and sid else None
    _, sep, sid = user.rpartition("_session_")
    return sid if sep and sid else None


def _has_breakpoint(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("cache_control"), dict)


def _ttl(blocks: list[Any]) -> float:
    for b in blocks:
        if _has_breakpoint(b) and b["cache_control"].get("ttl") == "1h":
            return TTL_1H
    return TTL_5M


def _blocks(doc: dict[str, Any]) -> list[Any]:
    """tools, system, then each message's content blocks, in the cache's order."""
    out: list[Any] = []
    for name in ("tools", "system"):
        value = doc.get(name)
        out += value if isinstance(value, list) else [value] if value is not None else []
    for msg in doc.get("messages") or []:
        content = msg.get("content") if isinstance(msg, dict) else None
        role = msg.get("role") if isinstance(msg, dict) else None
        if isinstance(content, list):
            out += [(role, b) for b in content]
        else:
            out.append((role, content))
    return out


def _plain(blocks: list[Any]) -> list[Any]:
    return [b[1] if isinstance(b, tuple) else b for b in blocks]


def _doc_ttl(doc: dict[str, Any]) -> float:
    return _ttl(_plain(_blocks(doc)))


def _prefix_session(model: str, doc: dict[str, Any]) -> Session | None:
    blocks = _blocks(doc)
    plain = _plain(blocks)
    last = max((i for i, b in enumerate(plain) if _has_breakpoint(b)), default=-1)
    if last < 0:
        return None
    digest = hashlib.sha256(model.encode())
    hashes: list[str] = []
    for block in blocks[:last + 1]:
        role, body = block if isinstance(block, tuple) else (None, block)
        if isinstance(body, dict) and "cache_control" in body:
            body = {k: v for k, v in body.items() if k != "cache_control"}
        digest.update(msgspec.json.encode([role, body]))
        hashes.append(digest.copy().hexdigest()[:32])
    lookup = tuple(reversed(hashes[max(0, len(hashes) - LOOKBACK):]))
    return Session(lookup=lookup, pin=hashes[-1], ttl_s=_ttl(plain[:last + 1]),
                   source="prefix")


def session_of(model: str, headers: dict[str, str], doc: dict[str, Any]) -> Session | None:
    """The request's session (None: nothing names one and nothing is cacheable)."""
    named = next(((headers[h], "header") for h in SESSION_HEADERS if headers.get(h)), None)
    if named is None:
        pck = doc.get("prompt_cache_key")
        sid = _metadata_session(doc)
        named = ((pck, "prompt_cache_key") if isinstance(pck, str) and pck
                 else (sid, "metadata") if sid is not None else None)
    if named is None:
        return _prefix_session(model, doc)
    value, source = named
    # Claude Code's header and its metadata name the same session: one key for both.
    key = _scoped(model, "prompt_cache_key" if source == "prompt_cache_key" else "session",
                  value)
    return Session(lookup=(key,), pin=key, ttl_s=_doc_ttl(doc), source=source)
