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

``--tokenizer``: counting OpenAI input with the ``tokenize`` extra, as the request path
of the checked-out commit does it — ``input_bound`` (on the event loop), then, where the
commit has it, the attempt's off-loop count (``gateway.ingress._bounds.off_loop``) — for
``--n`` Codex-shaped Responses bodies (tests/bench/bounds.py, ~75 KB) and short chats,
one at a time on one event loop. CPU is the process's (every thread) and the event-loop
thread's own per request, measured alone; the *stall* is, in a second pass, how late a
heartbeat task sleeping 0.5 ms at a time woke at worst during one request (median and
worst over requests). To
compare designs, run this file against another commit (a worktree with this file
copied into its ``tests/bench``).

    .venv/bin/python tests/bench/refine.py --tokenizer --n 200
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
from gateway.governance import Bounds  # noqa: E402
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
    bounds = Bounds(input_tokens=input_bound(body, doc, MODEL), output_tokens=64000,
                    price=MODEL.price, input_classes=input_classes(doc))
    return Call(gw=None, principal=None, endpoint="messages",  # type: ignore[arg-type]
                model=MODEL, doc=doc, body=body, stream=False, bounds=bounds,
                client_headers={}, deployments=[])


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


async def _bound(doc: dict[str, Any], body: bytes) -> int:
    """The request path's input bound for one Codex body, as the checked-out commit has
    it: ``input_bound``, then the attempt's off-loop count where there is one."""
    from gateway.ingress import _bounds
    from tests.bench.bounds import CODEX
    bound = input_bound(body, doc, CODEX)
    off_loop = getattr(_bounds, "off_loop", None)
    if off_loop is not None and (counted := await off_loop(body, doc, CODEX,
                                                           bound)) is not None:
        bound = counted
    return bound


async def _cpu(docs: list[dict[str, Any]]) -> tuple[float, float, float]:
    """(process CPU, event-loop thread CPU, wall) in ms per request, nothing else running."""
    bodies = [msgspec.json.encode(d) for d in docs]
    cpu, loop_cpu, wall = time.process_time(), time.thread_time(), time.perf_counter()
    for doc, body in zip(docs, bodies, strict=True):
        await _bound(doc, body)
    n = len(docs) / 1000
    return ((time.process_time() - cpu) / n, (time.thread_time() - loop_cpu) / n,
            (time.perf_counter() - wall) / n)


TICK_S = 0.0005


async def _stalls(docs: list[dict[str, Any]]) -> list[float]:
    """Each request's longest loop stall: how late a heartbeat task that sleeps
    ``TICK_S`` at a time woke (a loop serving sockets is mostly idle like this one; its
    ticks would pollute the CPU figures, so they are measured apart)."""
    bodies = [msgspec.json.encode(d) for d in docs]
    gaps: list[tuple[float, float]] = []
    running = True

    async def heartbeat() -> None:
        while running:
            t = time.perf_counter()
            await asyncio.sleep(TICK_S)
            gaps.append((t, time.perf_counter() - t - TICK_S))

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0.01)
    windows = []
    for doc, body in zip(docs, bodies, strict=True):
        start = time.perf_counter()
        await _bound(doc, body)
        windows.append((start, time.perf_counter()))
        await asyncio.sleep(4 * TICK_S)  # the heartbeat wakes between two requests
    running = False
    await beat
    return [max((g for t, g in gaps if a <= t + g and t <= b), default=0.0)
            for a, b in windows]


def tokenizer_main(n: int) -> None:
    import random

    from gateway.ingress._tokenize import encoding
    from tests.bench.bounds import codex, short_gpt
    encoding("o200k_base")  # loaded once per process, not measured
    rng = random.Random(7)
    print("| requests | body (KB) | CPU per request (ms) | of it on the loop's thread (ms) "
          "| wall (ms) | loop stall per request, median / worst (ms) |")
    print("|---|---|---|---|---|---|")
    for name, make in (("codex responses", codex), ("short chat", short_gpt)):
        docs = [make(rng)[1] for _ in range(n)]
        kb = sum(len(msgspec.json.encode(d)) for d in docs) / len(docs) / 1024
        cpu, loop_cpu, wall = asyncio.run(_cpu(docs))
        stalls = asyncio.run(_stalls(docs))
        print(f"| {name} | {kb:.1f} | {cpu:.2f} | {loop_cpu:.2f} | {wall:.2f} | "
              f"{statistics.median(stalls) * 1000:.2f} / {max(stalls) * 1000:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--tokenizer", action="store_true",
                        help="measure OpenAI input counting instead (see above)")
    args = parser.parse_args()
    if args.tokenizer:
        tokenizer_main(args.n)
        return
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
