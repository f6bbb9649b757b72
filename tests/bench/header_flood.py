"""Header flood: does a normal client keep its latency, and RSS stay bounded?

Starts a real gateway (local profile, built-in mock, one key), measures a normal client's
latency on ``/v1/chat/completions`` alone, then again while FLOODERS connections (no key)
each try to send 10 MB of one unfinished header, and samples the gateway's RSS
throughout. ``--plain`` runs the same app under stock uvicorn (no header limit, no read
timeout: what ``mayu serve`` did before issue 10), for the before/after comparison in
docs/deploy.md. Everything is on 127.0.0.1 and bounded in time.

    .venv/bin/python tests/bench/header_flood.py            # mayu serve (guarded)
    .venv/bin/python tests/bench/header_flood.py --plain    # stock uvicorn
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e._procs import (  # noqa: E402 (the repo root goes on sys.path first)
    Proc,
    _env,
    create_key,
    create_team,
    free_port,
    wait_ready,
)

FLOOD_BYTES = 10 * 1024 * 1024
PLAIN = """
import sys, uvicorn
from gateway.app import create_app
from gateway.config import load_settings
app = create_app(load_settings(sys.argv[1]))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning",
            access_log=False, lifespan="on")
"""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start(config: Path, *, plain: bool) -> Proc:
    port = free_port()
    log = config.parent / f"gateway-{port}.log"
    args = ([sys.executable, "-c", PLAIN, str(config), str(port)] if plain else
            [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port",
             str(port), "--log-level", "warning"])
    with log.open("wb") as out:
        popen = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=_env(),
                                 cwd=str(config.parent))
    return wait_ready(Proc(popen=popen, port=port, log_path=log))


def latencies(url: str, key: str, seconds: float) -> list[float]:
    body = {"model": "mock-gpt", "max_tokens": 8, "messages": [{"role": "user",
                                                                 "content": "hi"}]}
    out: list[float] = []
    end = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=30,
                      headers={"Authorization": f"Bearer {key}"}) as client:
        while time.monotonic() < end:
            t = time.perf_counter()
            r = client.post("/v1/chat/completions", json=body)
            out.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200, r.text
    return out


def flood(port: int, sent: list[int], stop: threading.Event) -> None:
    """One connection sending FLOOD_BYTES of an unfinished header, no key."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-flood: ")
            total, chunk = 0, b"a" * 65536
            while total < FLOOD_BYTES and not stop.is_set():
                sock.sendall(chunk)
                total += len(chunk)
            sent.append(total)
            stop.wait(10)  # hold the connection open with the header still unfinished
    except OSError:
        sent.append(-1)  # the server closed it (431 or a reset)


def summary(name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (f"{name}: n={len(ms)} p50={statistics.median(ms):.2f} ms "
            f"p99={p99:.2f} ms max={ms[-1]:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain", action="store_true", help="stock uvicorn, no guard")
    parser.add_argument("--flooders", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "mayu.yaml"
        config.write_text(yaml.safe_dump({"data_dir": str(Path(tmp) / "data"),
                                          "demo": False}))
        create_team(config, "bench")
        key = create_key(config, "bench")
        proc = start(config, plain=args.plain)
        try:
            latencies(proc.url, key, 1.0)  # warm up
            idle = rss_mb(proc.popen.pid)
            alone = latencies(proc.url, key, args.seconds)
            stop, sent, peak = threading.Event(), [], [rss_mb(proc.popen.pid)]
            threads = [threading.Thread(target=flood, args=(proc.port, sent, stop))
                       for _ in range(args.flooders)]
            for t in threads:
                t.start()

            def sample() -> None:
                while not stop.is_set():
                    peak.append(rss_mb(proc.popen.pid))
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample)
            sampler.start()
            flooded = latencies(proc.url, key, args.seconds)
            stop.set()
            for t in [*threads, sampler]:
                t.join(30)
            after = rss_mb(proc.popen.pid)
        finally:
            proc.stop()
    mode = "stock uvicorn (--plain)" if args.plain else "mayu serve (guarded)"
    cut = sum(1 for s in sent if s != FLOOD_BYTES)
    print(f"{mode}; {args.flooders} flooders x {FLOOD_BYTES // 2**20} MB unfinished header, "
          f"no key; {os.cpu_count()} CPUs")
    print(summary("normal client alone   ", alone))
    print(summary("normal client + flood ", flooded))
    print(f"flood connections cut off by the server: {cut} of {len(sent)}")
    print(f"RSS: idle {idle:.0f} MB, peak during flood {max(peak):.0f} MB, "
          f"after {after:.0f} MB")


if __name__ == "__main__":
    main()
