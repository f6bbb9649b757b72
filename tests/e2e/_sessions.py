"""Claude-Code-shaped agent sessions, many at once, through the real ``anthropic`` SDK.

Each session sends what Claude Code sends: its ``x-claude-code-session-id`` header and a
``claude-cli`` User-Agent; a stable prefix (two system blocks, the second marked with a
5-minute ``cache_control``, and a set of tools) shared by every session of one agent
version; a first prompt of its own; then per turn one assistant tool call and its tool
result, the conversation's last block carrying the moving breakpoint. What each answer
cost comes from the gateway's ``x-inferplane-cost-micro-usd``; what was read from and
written to the cache, from the upstreams' own ledgers.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import anthropic

TOOLS = 8
MAX_TOKENS = 4096


def _text(seed: int, words: int) -> str:
    """Deterministic prose-like words that differ by seed (no repeats to collapse)."""
    return " ".join(f"t{(seed * 6151 + i * 7727) % 65521:x}" for i in range(words))


def _stable_prefix() -> dict[str, Any]:
    tools = [{"name": f"Tool{i}", "description": _text(300 + i, 350),
              "input_schema": {"type": "object", "properties": {
                  "path": {"type": "string", "description": _text(400 + i, 20)}}}}
             for i in range(TOOLS)]
    return {"tools": tools, "system": [
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {"type": "text", "text": _text(7, 3000), "cache_control": {"type": "ephemeral"}}]}


PREFIX = _stable_prefix()


def _step(session: int, t: int) -> list[dict[str, Any]]:
    tool = f"toolu_{session:03d}_{t:03d}"
    return [{"role": "assistant", "content": [
                {"type": "text", "text": _text(session * 1000 + t, 30)},
                {"type": "tool_use", "id": tool, "name": f"Tool{t % TOOLS}",
                 "input": {"path": f"src/s{session}/m{t}.py"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": tool,
                 "content": _text(session * 5000 + t, 200 + 60 * (t % 4))}]}]


def turn_body(model: str, session: int, t: int) -> dict[str, Any]:
    """Turn ``t`` of session ``session``: the stable prefix, the session's first prompt,
    ``t`` steps, the last block marked."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": _text(session * 31 + 11, 250)}]}]
    for step in range(t):
        messages += _step(session, step)
    messages = copy.deepcopy(messages)
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return {"model": model, "max_tokens": MAX_TOKENS, **PREFIX, "messages": messages}


@dataclass
class SessionRun:
    """One session's answers: what the gateway charged, turn by turn."""

    session: int
    costs: list[int] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)

    @property
    def cost(self) -> int:
        return sum(self.costs)


def run_sessions(base_url: str, key: str, model: str, *, sessions: int = 20,
                 turns: int = 10, stagger_s: float = 0.05) -> list[SessionRun]:
    """``sessions`` sessions at once (each starting ``stagger_s`` after the previous, as
    people do), ``turns`` turns each, one request at a time within a session."""
    runs = [SessionRun(i) for i in range(sessions)]
    start = threading.Event()

    def one(run: SessionRun) -> None:
        client = anthropic.Anthropic(
            base_url=base_url, api_key=key, max_retries=0, timeout=120,
            default_headers={"x-claude-code-session-id": str(uuid.uuid4()),
                             "user-agent": "claude-cli/2.1.90 (external, cli)"})
        start.wait()
        time.sleep(run.session * stagger_s)
        for t in range(turns):
            raw = client.messages.with_raw_response.create(  # type: ignore[call-overload]
                **turn_body(model, run.session, t))
            run.statuses.append(int(raw.status_code))
            run.costs.append(int(raw.headers.get("x-inferplane-cost-micro-usd", "0")))

    with ThreadPoolExecutor(sessions) as pool:
        futures = [pool.submit(one, run) for run in runs]
        start.set()
        for f in futures:
            f.result()
    return runs


def cache_share(entries: list[dict[str, Any]], models: Collection[str]
                ) -> tuple[float, int, int]:
    """Of the cacheable input tokens the upstreams billed for ``models`` (reads + writes),
    the share billed as reads; and the two sums."""
    read = write = 0
    for e in entries:
        if e.get("model") not in models or not e.get("classes"):
            continue
        c = e["classes"]
        read += c["cache_read"]
        write += c["cache_write_5m"] + c["cache_write_1h"] + c["cache_write_unknown"]
    return (read / (read + write) if read + write else 0.0), read, write
