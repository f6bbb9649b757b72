"""Latency and CPU of refining an input bound (gateway.ingress._refine), per request.

Against a real ``mayu mock-upstream`` process reached by the gateway's own HTTP client
(``HttpProvider``, kind ``anthropic``), with Claude-Code-sized requests
(tests/bench/agent_budget.py's session, ~100–120 KB):

- *uncached*: a fresh cache each time: the request is hashed and counted upstream;
- *cached*: the same request again: answered from the cache;
- *prefix*: the session's next turn: its counted prefix + appended bytes, no call.

Wall time is the median of ``--n`` runs; CPU is this process's (the gateway side; the
mock upstream's own work is not in it) per refinement.

    .venv/bin/python tests/bench/refine.py --n 200
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway.config import Deployment, ModelSettings, ProviderSettings  # noqa: E402
from gateway.ingress._attempt import Call  # noqa: E402
from gateway.ingress._bounds import input_bound, input_classes  # noqa: E402
from gateway.ingress._refine import Refiner  # noqa: E402
from gateway.providers import HttpProvider  # noqa: E402
from tests.bench.agent_budget import turn  # noqa: E402
from tests.e2e._procs import start_mock_upstream  # noqa: E402

MODEL = ModelSettings(name="claude-opus-4-8", deployments=[
    Deployment(provider="up", upstream_model="mock-claude")])


def _call(doc: dict[str, Any]) -> Call:
    body = msgspec.json.encode(doc)
    return Call(gw=None, principal=None, endpoint="messages",  # type: ignore[arg-type]
                model=MODEL, doc=doc, body=body, stream=False,
                input_bound=input_bound(body, doc, MODEL), output_bound=64000,
                usd_bound=0, client_headers={}, deployments=[],
                input_classes=input_classes(doc))


async def _measure(provider: HttpProvider, n: int) -> dict[str, tuple[float, float]]:
    deployment = MODEL.deployments[0]
    first, second = turn(6), turn(7)
    runs: dict[str, list[tuple[float, float]]] = {"uncached": [], "cached": [], "prefix": []}
    for _ in range(n):
        refiner = Refiner(timeout_s=2.0, entries=4096)
        for name, doc in (("uncached", first), ("cached", first), ("prefix", second)):
            call = _call(doc)
            wall, cpu = time.perf_counter(), time.process_time()
            refined = await refiner.tighter(call, deployment, provider)
            runs[name].append((time.perf_counter() - wall, time.process_time() - cpu))
            assert refined is not None, name
    return {k: (statistics.median(w for w, _ in v), sum(c for _, c in v) / len(v))
            for k, v in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        upstream = start_mock_upstream(Path(tmp))
        try:
            provider = HttpProvider(ProviderSettings(name="up", kind="anthropic",
                                                     base_url=upstream.url))

            async def go() -> dict[str, tuple[float, float]]:
                await provider.start()
                try:
                    return await _measure(provider, args.n)
                finally:
                    await provider.close()
            figures = asyncio.run(go())
        finally:
            upstream.stop()
    body = len(msgspec.json.encode(turn(6)))
    print(f"request body {body} bytes, n={args.n}")
    print("| refinement | median wall (ms) | CPU per request (ms) |")
    print("|---|---|---|")
    for name, (wall, cpu) in figures.items():
        print(f"| {name} | {wall * 1000:.2f} | {cpu * 1000:.2f} |")


if __name__ == "__main__":
    main()
