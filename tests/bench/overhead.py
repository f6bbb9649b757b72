"""Gateway overhead benchmark (a script, not a test): direct upstream vs through mayu.

Starts ``mayu mock-upstream`` and ``mayu serve`` (local profile, a fresh temp data dir,
one team without limits) as real processes, then sends the same load — fixed
concurrency, small bodies, N requests — straight to the upstream and through the
gateway, and prints p50/p99 latency of each, the overhead in ms and the throughput
ratio. Every gateway request is authenticated, admitted, relayed, metered and settled.

    .venv/bin/python tests/bench/overhead.py [--requests 2000] [--concurrency 32] [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench._bench import cpu_s  # noqa: E402
from tests.e2e._procs import (  # noqa: E402
    create_key,
    create_team,
    start_gateway,
    start_mock_upstream,
)


async def _load(base: str, path: str, headers: dict[str, str], *, n: int, concurrency: int,
                stream: bool) -> tuple[list[float], float]:
    body = {"model": "mock-gpt", "max_tokens": 16, "stream": stream,
            "messages": [{"role": "user", "content": "say something short"}]}
    latencies: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits,
                                 timeout=60) as client:
        async def worker() -> None:
            while not queue.empty():
                queue.get_nowait()
                t0 = time.perf_counter()
                async with client.stream("POST", path, json=body) as r:
                    await r.aread()
                    if r.status_code != 200:
                        raise RuntimeError(f"{r.status_code}: {r.text}")
                latencies.append(time.perf_counter() - t0)

        for _ in range(min(100, n // 10 or 1)):  # warm up connections and caches
            async with client.stream("POST", path, json=body) as r:
                await r.aread()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return latencies, wall


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--stream", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mayu-bench-") as tmp:
        work = Path(tmp)
        upstream = start_mock_upstream(work)
        gateway = None
        try:
            config = work / "mayu.yaml"
            config.write_text(yaml.safe_dump({
                "data_dir": str(work / "data"), "demo": False,
                "providers": [{"name": "up", "kind": "openai",
                               "base_url": f"{upstream.url}/v1"}],
                "models": [{"name": "mock-gpt", "deployments": [{"provider": "up"}],
                            "price": {"input": 1_000_000, "output": 4_000_000}}]}))
            create_team(config, "bench")
            key = create_key(config, "bench")
            gateway = start_gateway(config)
            results = {}
            cpu: dict[str, tuple[float, float]] = {}
            for name, base, headers in (
                    ("direct", f"{upstream.url}/v1", {}),
                    ("gateway", f"{gateway.url}/v1", {"Authorization": f"Bearer {key}"})):
                before = (cpu_s(upstream.popen.pid), cpu_s(gateway.popen.pid))
                results[name] = asyncio.run(_load(
                    base, "/chat/completions", headers, n=args.requests,
                    concurrency=args.concurrency, stream=args.stream))
                cpu[name] = (cpu_s(upstream.popen.pid) - before[0],
                             cpu_s(gateway.popen.pid) - before[1])
        finally:
            if gateway is not None:
                gateway.stop()
            upstream.stop()
    print(f"requests={args.requests} concurrency={args.concurrency} "
          f"stream={args.stream}")
    print(f"{'':8} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'req/s':>8}")
    for name, (lat, wall) in results.items():
        print(f"{name:8} {_pct(lat, 50):8.2f} {_pct(lat, 99):8.2f} "
              f"{statistics.mean(lat) * 1000:8.2f} {len(lat) / wall:8.0f}")
    (d, dw), (g, gw) = results["direct"], results["gateway"]
    print(f"overhead p50 {_pct(g, 50) - _pct(d, 50):.2f} ms, "
          f"p99 {_pct(g, 99) - _pct(d, 99):.2f} ms; "
          f"throughput ratio gateway/direct {(len(g) / gw) / (len(d) / dw):.2f}")
    # CPU per request is robust to other load on the machine, unlike latency.
    n = args.requests + min(100, args.requests // 10 or 1)
    print(f"CPU per request: upstream {cpu['direct'][0] / n * 1000:.2f} ms; "
          f"gateway {cpu['gateway'][1] / n * 1000:.2f} ms "
          f"(the upstream meanwhile {cpu['gateway'][0] / n * 1000:.2f} ms); "
          f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
