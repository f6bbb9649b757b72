"""How tight the admission µUSD bound is over a realistic mix: the byte bound against
the bound counted with OpenAI's encoding (``gateway.ingress._tokenize``, the tokenize
extra), and what the rest of the Codex bound is made of (``docs/bounds.md``).

No processes, no network: each request body goes through the gateway's own bound
functions (``input_bound``, ``output_bound``, ``input_classes``, ``cost_bound_micro_usd``).
Its actual usage: for Claude requests what the mock model reports (``anthropic_classes``);
for OpenAI requests the tokens of the request's reference rendering in OpenAI's
published harmony format with the model's encoding (``tests/openai_render.py``; the
mock's one token per four bytes overcounts short-word text, beyond what the encoding
counts), half of it cached as the mock does, and the mock's output. Priced with the
built-in catalog. *bytes* is the bound with input counted as body bytes (every input
class the request allows), *counted* the bound the gateway admits with (the counted
input where the encoding applies). Prints, per workload and for the whole mix, the
median and worst bound/actual and Σ bound / Σ actual,
then the Codex breakdown, the Codex mix under each operator output cap
(``default_output_tokens``: the body goes through the gateway's own ``capped`` rewrite,
the bound through ``output_bound``, the mock answers the forwarded body) and the
counter's CPU per request, from one run::

    .venv/bin/python tests/bench/bounds.py [--n 50] [--seed 7] \
        [--caps off,2048,4096,8192,16384] [--codex-output TOKENS]

Money stays integer µUSD; only the printed ratios are floats.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gateway.catalog import builtin_catalog  # noqa: E402
from gateway.config import Deployment, ModelSettings, ServerSettings  # noqa: E402
from gateway.ingress._attempt import capped  # noqa: E402
from gateway.ingress._bounds import input_bound, input_classes  # noqa: E402
from gateway.ingress._prepare import output_bound  # noqa: E402
from gateway.ingress._tokenize import _load, encoding, input_ceiling  # noqa: E402
from gateway.mock._model import Classes, anthropic_classes, openai_classes  # noqa: E402
from gateway.pricing import Usage, cost_bound_micro_usd, cost_micro_usd  # noqa: E402
from gateway.usage import Endpoint  # noqa: E402
from tests.openai_render import render_tokens  # noqa: E402

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
    """One request's µUSD figures: the whole bound by bytes and counted, and the actual
    cost; the same for the input side alone; and the Codex breakdown's parts."""

    workload: str
    before: int
    after: int
    actual: int
    input_before: int
    input_after: int
    input_actual: int
    output_part: int
    """µUSD of the counted bound that is the output allowance."""
    tokens_bytes: int
    tokens_counted: int
    tokens_actual: int
    input_uncached: int
    """The actual input tokens' cost had none of them been cached."""
    output_tokens: int
    """The actual output tokens."""


CODEX_OUTPUT: int | None = None
"""``--codex-output``: the Codex requests' actual output tokens (stopped at the forwarded
limit, as the mock stops), instead of the mock's 8-31."""


def _usage(endpoint: Endpoint, doc: dict[str, Any]) -> Usage:
    if endpoint == "messages":
        return Usage(**anthropic_classes(doc).as_dict())
    c: Classes = openai_classes(doc, embeddings=endpoint == "embeddings")
    if CODEX_OUTPUT is not None and doc["model"] == CODEX.name:
        limit = doc.get("max_output_tokens")
        c = Classes(input=c.input, cache_read=c.cache_read,
                    output=CODEX_OUTPUT if limit is None else min(CODEX_OUTPUT, limit))
    enc = encoding("o200k_base")
    assert enc is not None, "the bench needs the tokenize extra"
    prompt = render_tokens(doc, enc)
    cached = 0 if prompt < 32 else prompt // 2
    return Usage(input=prompt - cached, cache_read=cached, output=c.output)


def measure(workload: str, endpoint: Endpoint, doc: dict[str, Any]) -> Row:
    model = MODELS[doc["model"]]
    body = msgspec.json.encode(doc)
    by_bytes = len(body) + model.input_overhead_tokens
    inp = input_bound(body, doc, model, inline_bytes=None)
    out = output_bound(doc, endpoint, model, ceiling=CEILING)
    usage = _usage(endpoint, doc)
    used_input = usage.total_tokens() - usage.output
    assert used_input <= inp <= by_bytes and usage.output <= out
    allowed = input_classes(doc)
    input_only = msgspec.structs.replace(usage, output=0)
    return Row(workload=workload,
               before=cost_bound_micro_usd(by_bytes, out, model.price, input_classes=allowed),
               after=cost_bound_micro_usd(inp, out, model.price, input_classes=allowed),
               actual=cost_micro_usd(usage, model.price),
               input_before=cost_bound_micro_usd(by_bytes, 0, model.price,
                                                 input_classes=allowed),
               input_after=cost_bound_micro_usd(inp, 0, model.price, input_classes=allowed),
               input_actual=cost_micro_usd(input_only, model.price),
               output_part=-(-out * model.price.output // 1_000_000),
               tokens_bytes=by_bytes, tokens_counted=inp, tokens_actual=used_input,
               input_uncached=cost_micro_usd(Usage(input=used_input), model.price),
               output_tokens=usage.output)


def _line(name: str, rows: list[Row], fields: tuple[str, str, str]) -> str:
    before, after, actual = fields

    def stats(bound: str) -> str:
        ratios = [getattr(r, bound) / getattr(r, actual) for r in rows]
        total = sum(getattr(r, bound) for r in rows) / sum(getattr(r, actual) for r in rows)
        return f"{statistics.median(ratios):8.2f} {max(ratios):8.2f} {total:8.2f}"
    return f"{name:<18} {len(rows):>4}   {stats(before)}    {stats(after)}"


def _table(title: str, rows: list[Row], fields: tuple[str, str, str]) -> None:
    head = f"{'median':>8} {'worst':>8} {'Σb/Σa':>8}"
    print(f"\n{title}\n{'':<18} {'':>4}   {'bytes':^26}    {'counted':^26}")
    print(f"{'workload':<18} {'n':>4}   {head}    {head}")
    for name in WORKLOADS:
        print(_line(name, [r for r in rows if r.workload == name], fields))
    print(_line("all", rows, fields))


def _median(values: list[float]) -> str:
    return f"median {statistics.median(values):7.2f}  worst {max(values):7.2f}"


def _codex_breakdown(rows: list[Row]) -> None:
    """What the Codex bound is made of, and what an output cap would leave of it."""
    codex_rows = [r for r in rows if r.workload == "codex responses"]
    parts = {
        "output allowance / whole bound": [r.output_part / r.after for r in codex_rows],
        "input bound by bytes / actual input tokens":
            [r.tokens_bytes / r.tokens_actual for r in codex_rows],
        "input bound counted / actual input tokens":
            [r.tokens_counted / r.tokens_actual for r in codex_rows],
        "actual input priced uncached / actual input cost":
            [r.input_uncached / r.input_actual for r in codex_rows],
    }
    for cap in (32_000, 8_192, 2_048):
        cost = -(-cap * CODEX.price.output // 1_000_000)
        parts[f"whole bound / actual, max_output_tokens {cap}"] = [
            (r.after - r.output_part + cost) / r.actual for r in codex_rows]
    print("\ncodex responses, per request (median, largest):")
    for name, values in parts.items():
        print(f"  {name:<50} {statistics.median(values):8.2f} {max(values):8.2f}")
    captured = ROOT / "tests" / "e2e" / "data" / "codex-cli-0.171.0-responses.json"
    body = captured.read_bytes()
    doc = msgspec.json.decode(body)
    inp = input_bound(body, doc, CODEX, inline_bytes=None)
    out = output_bound(doc, "responses", CODEX, ceiling=CEILING)
    print(f"  captured Codex CLI 0.171.0 request (hosted web_search): input bound {inp} "
          f"tokens ({cost_bound_micro_usd(inp, 0, CODEX.price, input_classes=input_classes(doc))}"
          f" µUSD), output {out} tokens ({-(-out * CODEX.price.output // 1_000_000)} µUSD)")


def _caps(docs: list[dict[str, Any]], caps: list[int | None]) -> None:
    """The Codex mix as the gateway admits it (counted input) under each output cap."""
    print("\ncodex responses under an operator output cap (default_output_tokens), "
          "bound / actual µUSD:")
    print(f"  {'cap':>6}  {'median':>8} {'worst':>8} {'Σb/Σa':>8}   {'input share':>11}"
          f"   {'input side: median':>19} {'worst':>6}")
    for cap in caps:
        ratios: list[float] = []
        shares: list[float] = []
        inputs: list[float] = []
        bounds = actuals = 0
        for client in docs:
            written = capped(client, "responses", cap)
            doc = client if written is None else written[0]
            row = measure("codex responses", "responses", doc)
            ratios.append(row.after / row.actual)
            shares.append(row.input_after / row.after)
            inputs.append(row.input_after / row.input_actual)
            bounds, actuals = bounds + row.after, actuals + row.actual
        print(f"  {cap or 'off':>6}  {statistics.median(ratios):8.2f} {max(ratios):8.2f} "
              f"{bounds / actuals:8.2f}   {statistics.median(shares):10.1%}"
              f"   {statistics.median(inputs):19.2f} {max(inputs):6.2f}")
    # The cap at which a request's bound is 3x its cost: 3 × actual less the input part
    # of its bound, in output tokens (the target, against the mock's answers).
    rows = [measure("codex responses", "responses", d) for d in docs]
    three = [(3 * r.actual - (r.after - r.output_part)) * 1_000_000 // CODEX.price.output
             for r in rows]
    print(f"  the cap at which bound/actual = 3: median {statistics.median(three):.0f} "
          f"output tokens, smallest {min(three)} (actual output "
          f"{min(r.output_tokens for r in rows)}-{max(r.output_tokens for r in rows)} "
          f"tokens per request, {'the mock' if CODEX_OUTPUT is None else '--codex-output'})")


def _cpu(rng: random.Random) -> None:
    """CPU of the counted bound per Codex-shaped request (input_bound, bytes → tokens)."""
    docs = [codex(rng)[1] for _ in range(20)]
    bodies = [msgspec.json.encode(d) for d in docs]
    encoding("o200k_base")  # loaded once per process (timed apart)
    start = time.process_time()
    for _ in range(5):
        for doc in docs:
            input_ceiling(doc, CODEX)
    per = (time.process_time() - start) / (5 * len(docs))
    kb = sum(map(len, bodies)) / len(bodies) / 1024
    t0 = time.process_time()
    assert _load("o200k_base") is not None
    print(f"\ncounter CPU: {per * 1e3:.2f} ms per Codex request ({kb:.0f} KB body, "
          f"{per * 1e6 / kb:.0f} µs/KB); loading o200k_base once per process: "
          f"{time.process_time() - t0:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50, help="requests per workload")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--caps", default="off,2048,4096,8192,16384",
                        help="output caps to measure the Codex mix at (off: none)")
    parser.add_argument("--codex-output", type=int, default=None,
                        help="Codex requests' actual output tokens (default: the mock's)")
    args = parser.parse_args()
    global CODEX_OUTPUT
    CODEX_OUTPUT = args.codex_output
    caps = [None if c == "off" else int(c) for c in args.caps.split(",") if c]
    rng = random.Random(args.seed)
    made = [(name, *make(rng)) for name, make in WORKLOADS.items() for _ in range(args.n)]
    rows = [measure(*m) for m in made]
    assert all(r.actual <= r.after <= r.before for r in rows)
    print(f"bound / actual µUSD, {args.n} requests per workload, seed {args.seed}; prices: "
          f"catalog {builtin_catalog().as_of} ({CLAUDE.name}, {CODEX.name}, {GPT.name})")
    _table("whole request (input + output bound)", rows, ("before", "after", "actual"))
    _table("input side only", rows, ("input_before", "input_after", "input_actual"))
    _codex_breakdown(rows)
    _caps([doc for name, _, doc in made if name == "codex responses"], caps)
    _cpu(rng)


if __name__ == "__main__":
    main()
