"""What interrupted and price-uncertain requests are charged, against the upstream's truth.

Runs a real ``mayu mock-upstream`` and a real ``mayu serve`` (local profile, the e2e
config) and prints, per case, the committed µUSD, the liability and what the old rule
("an uncertain outcome commits its whole bound") would have committed, each as a ratio to
the truth — the cost of what the upstream actually did (for a cut stream: the whole
answer it would have reported; nothing less was generated):

    .venv/bin/python tests/bench/settlement.py [--n 20]

Cases: a Claude-Code-shaped Anthropic stream (cached system prompt, large max_tokens)
cut by the client after three events; an OpenAI chat stream cut the same way; Anthropic
cache writes reported without their TTL (tokens_known).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gateway.mock._model import Classes, anthropic_classes, openai_classes  # noqa: E402
from gateway.pricing import ModelPrice, Usage, cost_micro_usd  # noqa: E402
from tests.e2e._procs import create_key, create_team, start_gateway, start_mock_upstream  # noqa: E402
from tests.e2e.conftest import _UPSTREAM, PRICE, gateway_config  # noqa: E402

SYSTEM_1H = [{"type": "text", "text": "You are Claude Code. " * 400,
              "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
SYSTEM = [{"type": "text", "text": "You are Claude Code. " * 400,
           "cache_control": {"type": "ephemeral"}}]


def _as_upstream(body: dict[str, Any]) -> dict[str, Any]:
    """The body as the mock upstream sees it (its model name switches its behaviour)."""
    return {**body, "model": _UPSTREAM[body["model"]][1]}


def _cut_after(url: str, path: str, body: dict[str, Any], headers: dict[str, str],
               events: int) -> str:
    seen = 0
    with httpx.Client(base_url=url, timeout=60) as client, \
            client.stream("POST", path, json=body, headers=headers) as r:
        permit = r.headers["x-inferplane-permit"]
        for chunk in r.iter_bytes():
            seen += chunk.count(b"\n\n")
            if seen >= events:
                break
    return permit


def _settled_line(audit_dir: Path, permit: str) -> dict[str, Any]:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        for path in audit_dir.glob("audit-*.jsonl"):
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                if rec.get("permit") == permit and rec.get("event") == "settled":
                    return rec
        time.sleep(0.05)
    raise RuntimeError(f"permit {permit} never settled")


Figures = tuple[int, int, int, int]
"""A settled permit's committed, liability and bound µUSD, and the truth it is held to."""


def _figures(audit_dir: Path, permit: str, truth: int) -> Figures:
    line = _settled_line(audit_dir, permit)
    return line["usd_committed"], line["usd_liability"], line["usd_bound"], truth


def _cut_stream(url: str, audit_dir: Path, path: str, body: dict[str, Any],
                headers: dict[str, str], classes: Callable[[dict[str, Any]], Classes],
                price: ModelPrice) -> Figures:
    """A stream cut by the client after three events, held to the whole answer's cost
    (what the upstream would have reported for ``body``)."""
    permit = _cut_after(url, path, body, headers, 3)
    truth = cost_micro_usd(Usage(**classes(_as_upstream(body)).as_dict()), price)
    return _figures(audit_dir, permit, truth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10, help="requests per case")
    n = parser.parse_args().n
    price = ModelPrice(**PRICE)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        upstream = start_mock_upstream(work)
        config = gateway_config(work, upstream)
        gateway = start_gateway(config, env={"MAYU_E2E_ADMIN_TOKEN": "bench-settlement-token"})
        try:
            create_team(config, "bench", "--usd-micros-per-day", str(10**12))
            key = create_key(config, "bench")
            audit = work / "data"
            anthropic = {"x-api-key": key, "anthropic-version": "2023-06-01"}
            cases: dict[str, list[Figures]] = defaultdict(list)
            for i in range(n):
                body = {"model": "claude-slow", "max_tokens": 32_000, "stream": True,
                        "system": SYSTEM,
                        "messages": [{"role": "user", "content": f"fix the bug #{i}"}]}
                cases["anthropic stream cut by the client"].append(_cut_stream(
                    gateway.url, audit, "/v1/messages", body, anthropic, anthropic_classes,
                    price))
                body = {"model": "gpt-slow", "max_tokens": 16_000, "stream": True,
                        "messages": [{"role": "user", "content": f"write tests #{i}"}]}
                cases["openai chat stream cut by the client"].append(_cut_stream(
                    gateway.url, audit, "/v1/chat/completions", body,
                    {"Authorization": f"Bearer {key}"}, openai_classes, price))
                # A 1h breakpoint: writes reported without the TTL may be 5m or 1h (a
                # request without one gets exact 5m settlements, docs/settlement.md).
                body = {"model": "claude-nottl", "max_tokens": 256, "system": SYSTEM_1H,
                        "messages": [{"role": "user", "content": f"explain #{i}"}]}
                r = httpx.post(f"{gateway.url}/v1/messages", json=body, timeout=60,
                               headers=anthropic)
                classes = anthropic_classes(_as_upstream(body)).as_dict()
                unknown = classes.pop("cache_write_unknown")
                classes["cache_write_1h"] += unknown  # the dearer truth
                cases["cache writes without TTL (tokens_known, 1h truth)"].append(_figures(
                    audit, r.headers["x-inferplane-permit"], cost_micro_usd(Usage(**classes),
                                                                            price)))
        finally:
            gateway.stop()
            upstream.stop()
    print(f"{'case':<52} {'committed/truth':>16} {'(c+liab)/truth':>15} "
          f"{'old: bound/truth':>17}")
    for name, rows in cases.items():
        med = statistics.median
        print(f"{name:<52} {med(c / t for c, _, _, t in rows):>16.3f} "
              f"{med((c + li) / t for c, li, _, t in rows):>15.2f} "
              f"{med(b / t for _, _, b, t in rows):>17.2f}")
        assert all(c <= t <= c + li for c, li, _, t in rows), rows


if __name__ == "__main__":
    main()
