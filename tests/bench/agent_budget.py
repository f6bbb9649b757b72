"""A small budget at Opus prices under a Claude-Code-shaped session (issue 26).

Starts ``mayu mock-upstream`` and ``mayu serve`` from the tree this file is in (so the
same script measures another commit from its worktree), creates a team with a daily
µUSD limit and budget fit, and replays a Claude Code session with the real ``anthropic``
SDK: a large system prompt and 18 tools (~60 KB of JSON, the stable prefix marked with
``cache_control``), a conversation that grows by an assistant tool call and a tool result
each turn, the last block marked, ``max_tokens`` 64000 — until the gateway refuses.
Optionally some turns are interrupted (the client closes the stream after its first
text event, as a Ctrl-C does).

Reports turns admitted, committed + liability as a share of the limit (from
``/v1/usage``), the upstream's own record (Σ of its ledger, priced with the catalog), the
input-bound basis of each answer and count calls answered by the upstream.

    .venv/bin/python tests/bench/agent_budget.py --limit 1000000
    .venv/bin/python tests/bench/agent_budget.py --limit 5000000 --interrupt 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import anthropic
import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.catalog import builtin_catalog  # noqa: E402
from gateway.pricing import ModelPrice, Usage, cost_micro_usd  # noqa: E402
from tests.e2e._procs import (  # noqa: E402
    Proc,
    create_key,
    create_team,
    upstream_and_gateway,
)

MODEL = "claude-opus-4-8"
SLOW = "claude-opus-4-8-interrupted"
UNCOUNTED = "claude-opus-4-8-uncounted"
"""Its upstream answers every ``count_tokens`` with a 500."""
MAX_TOKENS = 64_000


def _words(seed: int, n: int) -> str:
    """``n`` deterministic, varied words (prose-like bytes, no repetition to compress)."""
    return " ".join(f"w{(seed * 7919 + i * 104729) % 99991:x}" for i in range(n))


def _tool(i: int) -> dict[str, Any]:
    return {"name": f"Tool{i}", "description": _words(100 + i, 480),
            "input_schema": {"type": "object", "properties": {
                f"arg{j}": {"type": "string", "description": _words(1000 + i * 10 + j, 25)}
                for j in range(4)}, "required": ["arg0"]}}


def prefix() -> dict[str, Any]:
    """Claude Code's fixed part: two system blocks and 18 tools, the system marked."""
    return {"system": [
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {"type": "text", "text": _words(1, 4200), "cache_control": {"type": "ephemeral"}}],
        "tools": [_tool(i) for i in range(18)]}


def exchange(t: int) -> list[dict[str, Any]]:
    """One agent step after the first prompt: a tool call and its result."""
    return [{"role": "assistant", "content": [
                {"type": "text", "text": _words(5000 + t, 40)},
                {"type": "tool_use", "id": f"toolu_{t:04d}", "name": f"Tool{t % 18}",
                 "input": {"arg0": f"src/module_{t}.py"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"toolu_{t:04d}",
                 "content": _words(9000 + t, 150 + 90 * (t % 5))}]}]


def turn(t: int, *, model: str = MODEL) -> dict[str, Any]:
    """The request of step ``t``: the prefix, the first prompt, ``t`` exchanges; the last
    content block carries Claude Code's moving breakpoint."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>" + _words(2, 300) + "</system-reminder>"},
        {"type": "text", "text": "Fix the failing test in tests/test_parser.py"}]}]
    for step in range(t):
        messages += exchange(step)
    messages = json.loads(json.dumps(messages))
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return {"model": model, "max_tokens": MAX_TOKENS, **prefix(), "messages": messages}


def config_file(workdir: Path, upstream: Proc, refine: str | None, *,
                shared: dict[str, Any] | None = None, name: str = "mayu") -> Path:
    """The gateway's config: the mock upstream as an ``anthropic`` provider; ``shared``
    adds the shared profile's settings (one replica of several: its own data dir)."""
    extra = {} if refine is None else {"refine_input": refine}
    config: dict[str, Any] = {
        "data_dir": str(workdir / ("data" if name == "mayu" else name)), "demo": False,
        "server": {"max_body_bytes": 1 << 20, **({"replica_id": name} if shared else {})},
        **(shared or {}),
        "providers": [{"name": "up", "kind": "anthropic", "base_url": upstream.url,
                       "timeout_s": 30}],
        "models": [
            {"name": MODEL, **extra,
             "deployments": [{"provider": "up", "upstream_model": "mock-claude"}]},
            {"name": SLOW, "catalog": MODEL, **extra,
             "deployments": [{"provider": "up", "upstream_model": "mock-slow-stream"}]},
            {"name": UNCOUNTED, "catalog": MODEL, **extra,
             "deployments": [{"provider": "up", "upstream_model": "mock-count-error"}]}]}
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _interrupt(client: anthropic.Anthropic, body: dict[str, Any]) -> None:
    """A Ctrl-C: the stream is closed after its first text event."""
    with client.messages.stream(**{**body, "model": SLOW}) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                break


def run(*, limit: int, floor: int = 1024, interrupt: int = 0, refine: str | None = None,
        max_turns: int = 60) -> dict[str, Any]:
    """The session until the first refusal; the figures the docstring names."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        with upstream_and_gateway(workdir, lambda upstream: config_file(
                workdir, upstream, refine)) as (gateway, upstream, config):
            create_team(config, "small", "--usd-micros-per-day", str(limit),
                        "--budget-fit-floor", str(floor))
            key = create_key(config, "small")
            result = session([gateway], upstream, key, limit=limit, interrupt=interrupt,
                             max_turns=max_turns)
            gateway.stop()
            result["audit_bases"] = _audit_bases(workdir / "data")
            return result


def _audit_bases(data: Path) -> list[str]:
    """The input-bound basis of each admitted or refused audit line (byte if none)."""
    lines = [json.loads(line) for path in sorted(data.glob("audit-*.jsonl"))
             for line in path.read_text().splitlines() if line]
    return [a.get("input_bound", "byte") for a in lines
            if a.get("event") in ("admitted", "refused")]


def session(gateways: list[Proc], upstream: Proc, key: str, *, limit: int,
            interrupt: int = 0, max_turns: int = 60) -> dict[str, Any]:
    """Replay the session through ``gateways`` (turn ``t`` on ``gateways[t % n]``: the
    replicas of one shared store) until a refusal; the figures the docstring names."""
    clients = [anthropic.Anthropic(base_url=g.url, api_key=key, max_retries=0, timeout=60)
               for g in gateways]
    for t in range(interrupt):
        _interrupt(clients[t % len(clients)], turn(t))
    answers: list[dict[str, Any]] = []
    refusal: str | None = None
    for t in range(interrupt, interrupt + max_turns):
        try:
            raw = clients[t % len(clients)].messages.with_raw_response.create(**turn(t))
        except anthropic.APIStatusError as exc:
            refusal = f"{exc.status_code}: {exc.message}"
            answers.append({"turn": t, "status": exc.status_code,
                            "input_bound": exc.response.headers.get(
                                "x-inferplane-input-bound", "byte")})
            break
        answers.append({"turn": t, "status": 200,
                        "cost": int(raw.headers["x-inferplane-cost-micro-usd"]),
                        "fit": raw.headers.get("x-inferplane-budget-fit"),
                        "input_bound": raw.headers.get("x-inferplane-input-bound", "byte")})
    gateway = gateways[0]
    rows = httpx.get(f"{gateway.url}/v1/usage",
                     headers={"Authorization": f"Bearer {key}"}).json()["data"]
    team = next(r for r in rows if r["scope"] == "team" and r["window"] == "day")
    ledger = httpx.get(f"{upstream.url}/__mock/ledger").json()
    counts = httpx.get(f"{upstream.url}/__mock/counts")
    price = builtin_catalog().get(MODEL)
    assert price is not None
    upstream_usd = sum(cost_micro_usd(Usage(**e["classes"]), ModelPrice(
        **{c: price.price.per_class(c) for c in ModelPrice.__struct_fields__}))
        for e in ledger if e["classes"])
    held = team["usd_committed"] + team["usd_liability"] + team["usd_reserved"]
    return {"limit": limit, "admitted": sum(a["status"] == 200 for a in answers),
            "interrupted": interrupt, "usd_committed": team["usd_committed"],
            "usd_liability": team["usd_liability"], "usd_reserved": team["usd_reserved"],
            "held_pct": round(100 * held / limit, 1), "upstream_usd": upstream_usd,
            "upstream_entries": len(ledger),
            "count_calls": counts.json()["counts"] if counts.status_code == 200 else None,
            "answers": answers, "refusal": refusal}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=1_000_000)
    parser.add_argument("--floor", type=int, default=1024)
    parser.add_argument("--interrupt", type=int, default=0)
    parser.add_argument("--refine", choices=("on_shortfall", "always", "off"))
    args = parser.parse_args()
    result = run(limit=args.limit, floor=args.floor, interrupt=args.interrupt,
                 refine=args.refine)
    for a in result.pop("answers"):
        print(json.dumps(a))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
