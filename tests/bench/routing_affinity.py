"""Cache affinity vs round robin under Claude-Code-shaped sessions (issue 37).

Starts one upstream per deployment, each its own server cache (two Bedrock regions, the
Bedrock peer, and one ``mayu mock-upstream --prompt-cache``), and ``mayu serve`` from the
tree this file is in, with two models over the same
deployments: one with ``routing.affinity`` and one plain round robin. Runs ``--sessions``
concurrent sessions of ``--turns`` turns through each (the real ``anthropic`` SDK,
Claude Code's session header, a stable prefix with a 5-minute breakpoint and a growing
conversation) and prints, for both, the share of cacheable input tokens the upstreams
billed as cache reads and what each session cost (the gateway's own
``x-inferplane-cost-micro-usd``).

    .venv/bin/python tests/bench/routing_affinity.py [--sessions 20] [--turns 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.e2e._routing import start_routed  # noqa: E402
from tests.e2e._sessions import cache_share, run_sessions  # noqa: E402
from tests.e2e.test_routing_affinity import DEPLOYMENTS, routed_model, upstream_models  # noqa: E402

STRATEGIES = {"affinity": {"strategy": "weighted", "affinity": True,
                           "on_affinity_conflict": "preferFallback"},
              "round-robin": {"strategy": "weighted"}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--turns", type=int, default=10)
    args = ap.parse_args()
    models = [routed_model(name, name, routing) for name, routing in STRATEGIES.items()]
    with tempfile.TemporaryDirectory(prefix="mayu-affinity-") as tmp:
        stack = start_routed(Path(tmp), DEPLOYMENTS, models)
        try:
            key = stack.key("bench")
            costs = {name: run_sessions(stack.gateway.url, key, name,
                                        sessions=args.sessions, turns=args.turns)
                     for name in STRATEGIES}
            entries = [e for d in DEPLOYMENTS for e in stack.ledger(d)]
        finally:
            stack.stop()
    for name, runs in costs.items():
        share, read, write = cache_share(entries, upstream_models(name).values())
        per = [r.cost for r in runs]
        print(f"{name:12s} cache reads {share:6.1%} of {read + write} cacheable tokens; "
              f"cost per session µUSD median {statistics.median(per):.0f}, "
              f"min {min(per)}, max {max(per)}, total {sum(per)}")
    print("session " + " ".join(f"{n:>12s}" for n in costs))
    for i in range(args.sessions):
        print(f"{i:7d} " + " ".join(f"{costs[n][i].cost:12d}" for n in costs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
