"""How tight the admission µUSD bound is over a realistic mix, before and after the rule
that prices input only at the classes a request can produce (``docs/bounds.md``).

No processes, no network: each request body goes through the gateway's own bound
functions (``input_bound``, ``output_bound``, ``input_classes``, ``cost_bound_micro_usd``)
and its actual usage is what the mock model reports for it (``anthropic_classes`` /
``openai_classes``), priced with the built-in catalog. *before* prices every input token
at the dearest class of the model; *after* at the dearest class the request allows.
Prints, per workload and for the whole mix, the median and the worst (largest)
bound/actual ratio, and Σ bound / Σ actual (how much budget the reservations hold per
µUSD really spent), from one run::

    .venv/bin/python tests/bench/bounds.py [--n 50] [--seed 7]

Money stays integer µUSD; only the printed ratios are floats.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.catalog import builtin_catalog  # noqa: E402
from gateway.config import Deployment, ModelSettings, ServerSettings  # noqa: E402
from gateway.ingress._bounds import input_bound, input_classes  # noqa: E402
from gateway.ingress._prepare import output_bound  # noqa: E402
from gateway.mock._model import Classes, anthropic_classes, openai_classes  # noqa: E402
from gateway.pricing import Usage, cost_bound_micro_usd, cost_micro_usd  # noqa: E402
from gateway.usage import Endpoint  # noqa: E402

CEILING = ServerSettings().max_output_tokens
WORDS = ("the", "file", "function", "returns", "value", "test", "error", "config", "request",
         "token", "cache", "model", "build", "path", "user", "system", "tool", "stream")


def _model(catalog_id: str) -> ModelSettings:
    entry = builtin_catalog().get(catalog_id)
    assert entry is not None, catalog_id
    return ModelSettings(name=catalog_id, deployments=[Deployment(provider="p")],
                         price=entry.price, max_output_tokens=entry.max_output_tokens,
                         max_input_tokens=entry.max_input_tokens)


CLAUDE, CODEX, GPT = _model("claude-sonnet-4-6"), _model("gpt-5.1-codex"), _model("gpt-5")


def _text(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of prose (the mock counts four bytes a token)."""
    out: list[str] = []
    size = 0
    while size < 4 * tokens:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


def _tools(rng: random.Random, n: int, *, anthropic: bool) -> list[dict[str, Any]]:
    schema = {"type": "object", "properties": {"path": {"type": "string"},
                                               "content": {"type": "string"}}}
    if anthropic:
        return [{"name": f"tool_{i}", "description": _text(rng, 600), "input_schema": schema}
                for i in range(n)]
    return [{"type": "function", "name": f"tool_{i}", "description": _text(rng, 300),
             "parameters": schema} for i in range(n)]


def claude_code(rng: random.Random, *, one_hour: bool) -> tuple[Endpoint, dict[str, Any]]:
    """Claude Code: a large cached system prompt and tool list, a growing conversation with
    a breakpoint on its last turn, ``max_tokens`` 32000; 5m markers, or 1h on the
    stable prefix."""
    prefix_cc: dict[str, Any] = {"type": "ephemeral", **({"ttl": "1h"} if one_hour else {})}
    tools = _tools(rng, 16, anthropic=True)
    tools[-1]["cache_control"] = prefix_cc
    turns: list[dict[str, Any]] = []
    for i in range(rng.randint(1, 20)):
        turns.append({"role": "user", "content": _text(rng, rng.randint(20, 1500))})
        turns.append({"role": "assistant", "content": _text(rng, rng.randint(50, 800))})
        del i
    turns.append({"role": "user", "content": [
        {"type": "text", "text": _text(rng, rng.randint(20, 400)),
         "cache_control": {"type": "ephemeral"}}]})
    return "messages", {
        "model": CLAUDE.name, "max_tokens": 32000, "stream": True, "tools": tools,
        "system": [{"type": "text", "text": "You are Claude Code."},
                   {"type": "text", "text": _text(rng, 3000), "cache_control": prefix_cc}],
        "messages": turns}


def codex(rng: random.Random) -> tuple[Endpoint, dict[str, Any]]:
    """Codex: Responses API, long instructions, function tools, a transcript of messages and
    tool outputs, no output limit (the model's 128K ceiling bounds it)."""
    items: list[dict[str, Any]] = []
    for i in range(rng.randint(1, 15)):
        items.append({"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": _text(rng, rng.randint(20, 600))}]})
        items.append({"type": "function_call", "call_id": f"c{i}", "name": "shell",
                      "arguments": '{"cmd": "ls"}'})
        items.append({"type": "function_call_output", "call_id": f"c{i}",
                      "output": _text(rng, rng.randint(50, 2000))})
    return "responses", {
        "model": CODEX.name, "instructions": _text(rng, 6000), "input": items,
        "tools": _tools(rng, 8, anthropic=False), "reasoning": {"effort": "medium"},
        "store": False, "stream": True, "prompt_cache_key": f"session-{rng.randint(0, 9)}"}


def plain_chat(rng: random.Random) -> tuple[Endpoint, dict[str, Any]]:
    """An OpenAI chat with a document-sized prompt, max_completion_tokens 4096."""
    return "chat", {"model": GPT.name, "max_completion_tokens": 4096, "messages": [
        {"role": "system", "content": _text(rng, 200)},
        {"role": "user", "content": _text(rng, rng.randint(500, 4000))}]}


def short_claude(rng: random.Random) -> tuple[Endpoint, dict[str, Any]]:
    """A short question to Claude, no cache marker, max_tokens 1024."""
    return "messages", {"model": CLAUDE.name, "max_tokens": 1024, "messages": [
        {"role": "user", "content": _text(rng, rng.randint(5, 80))}]}


def short_gpt(rng: random.Random) -> tuple[Endpoint, dict[str, Any]]:
    """A short question to GPT-5 (chat completions), max_tokens 1024."""
    return "chat", {"model": GPT.name, "max_tokens": 1024, "messages": [
        {"role": "user", "content": _text(rng, rng.randint(5, 80))}]}


WORKLOADS: dict[str, Callable[[random.Random], tuple[Endpoint, dict[str, Any]]]] = {
    "claude-code 5m": lambda rng: claude_code(rng, one_hour=False),
    "claude-code 1h": lambda rng: claude_code(rng, one_hour=True),
    "codex responses": codex,
    "plain chat": plain_chat,
    "short claude chat": short_claude,
    "short gpt chat": short_gpt,
}
MODELS = {m.name: m for m in (CLAUDE, CODEX, GPT)}


@dataclass(frozen=True)
class Row:
    """One request's µUSD figures: whole bound before/after and actual cost, and the same
    for the input side alone (what the rule changes; the output part is the same)."""

    workload: str
    before: int
    after: int
    actual: int
    input_before: int
    input_after: int
    input_actual: int


def _usage(endpoint: Endpoint, doc: dict[str, Any]) -> Usage:
    c: Classes = (anthropic_classes(doc) if endpoint == "messages"
                  else openai_classes(doc, embeddings=endpoint == "embeddings"))
    return Usage(**c.as_dict())


def measure(workload: str, endpoint: Endpoint, doc: dict[str, Any]) -> Row:
    model = MODELS[doc["model"]]
    body = msgspec.json.encode(doc)
    inp = input_bound(body, doc, model)
    out = output_bound(doc, endpoint, model, ceiling=CEILING)
    usage = _usage(endpoint, doc)
    assert usage.total_tokens() - usage.output <= inp and usage.output <= out
    allowed = input_classes(doc)
    input_only = msgspec.structs.replace(usage, output=0)
    return Row(workload=workload,
               before=cost_bound_micro_usd(inp, out, model.price),
               after=cost_bound_micro_usd(inp, out, model.price, input_classes=allowed),
               actual=cost_micro_usd(usage, model.price),
               input_before=cost_bound_micro_usd(inp, 0, model.price),
               input_after=cost_bound_micro_usd(inp, 0, model.price, input_classes=allowed),
               input_actual=cost_micro_usd(input_only, model.price))


def _line(name: str, rows: list[Row], fields: tuple[str, str, str]) -> str:
    before, after, actual = fields

    def stats(bound: str) -> str:
        ratios = [getattr(r, bound) / getattr(r, actual) for r in rows]
        total = sum(getattr(r, bound) for r in rows) / sum(getattr(r, actual) for r in rows)
        return f"{statistics.median(ratios):8.2f} {max(ratios):8.2f} {total:8.2f}"
    return f"{name:<18} {len(rows):>4}   {stats(before)}    {stats(after)}"


def _table(title: str, rows: list[Row], fields: tuple[str, str, str]) -> None:
    head = f"{'median':>8} {'worst':>8} {'Σb/Σa':>8}"
    print(f"\n{title}\n{'':<18} {'':>4}   {'before':^26}    {'after':^26}")
    print(f"{'workload':<18} {'n':>4}   {head}    {head}")
    for name in WORKLOADS:
        print(_line(name, [r for r in rows if r.workload == name], fields))
    print(_line("all", rows, fields))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50, help="requests per workload")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = [measure(name, *make(rng)) for name, make in WORKLOADS.items()
            for _ in range(args.n)]
    assert all(r.actual <= r.after <= r.before for r in rows)
    print(f"bound / actual µUSD, {args.n} requests per workload, seed {args.seed}; prices: "
          f"catalog {builtin_catalog().as_of} ({CLAUDE.name}, {CODEX.name}, {GPT.name})")
    _table("whole request (input + output bound)", rows, ("before", "after", "actual"))
    _table("input side only (what the rule changes)", rows,
           ("input_before", "input_after", "input_actual"))

if __name__ == "__main__":
    main()
