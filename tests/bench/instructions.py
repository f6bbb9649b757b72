"""Instructions per request of ``mayu serve`` under callgrind, against another checkout.

A script, not a test: the CPU figure a loaded machine does not move.

Each gateway runs under ``valgrind --tool=callgrind``, which counts the instructions the
process executes rather than timing them, so the count for the same code, inputs and
load stays within a few per cent from run to run whatever else the machine does (the
event loop's batching and the gateway's own timers move it by about ±1.6 %: compare
ratios, and repeat a run before believing a difference below that). For each profile
(``--profiles``) and answer kind (``--sse``): one gateway from this checkout and one from
``--baseline`` (a git worktree, e.g. ``git worktree add /tmp/base HEAD~5``), each with a
database or data dir of its own migrated by its own checkout, the same fake upstream
(``tests/bench/_fastup.py``) and the same team limits as ``speed.py``; ``--warmup``
requests, then the counters are zeroed (``callgrind_control -z``), ``--requests`` requests
at c=4, and the count is dumped. Prints instructions per request and the ratio.

Needs ``valgrind`` (Debian's package). The gateways run ~50 times slower under it: the
default 1,500 requests take about two minutes per gateway.

    .venv/bin/python tests/bench/instructions.py --baseline /tmp/base \\
        [--profiles local,shared] [--sse] [--requests 1500]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench._bench import server_dsn  # noqa: E402
from tests.bench._loadgen import run_load  # noqa: E402
from tests.bench.speed import (  # noqa: E402
    _gateway_config,
    _migrate,
    _team_key,
    body,
    fast_upstream,
)
from tests.conftest import create_database, drop_database, dsn_for  # noqa: E402
from tests.e2e._procs import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _serve(config: Path, env: dict[str, str], root: Path,
           out: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``mayu serve`` of checkout ``root`` under callgrind, once it answers /readyz."""
    port = free_port()
    log = out.with_suffix(".log")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
         "-m", "gateway", "serve", "--config", str(config), "--port", str(port),
         "--log-level", "warning"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=str(root),
        env={**os.environ, **env, "PYTHONPATH": str(root)})
    end = time.monotonic() + 300
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"mayu serve ({root}) exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"mayu serve ({root}) not ready within 300 s: {log.read_text()[-2000:]}")


def _dumped_total(out: Path) -> int:
    """The instruction total of the dump ``callgrind_control -d`` wrote (not the one the
    process wrote at its exit)."""
    for path in sorted(out.parent.glob(out.name + "*"), key=os.path.getmtime):
        text = path.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: (.*)$", text, re.M)
        total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
        if trigger and total and "Program termination" not in trigger.group(1):
            return int(total.group(1))
    raise SystemExit(f"no callgrind dump found beside {out}")


def measure(work: Path, upstream: int, profile: str, name: str, root: Path, *,
            sse: bool, warmup: int, requests: int) -> float:
    """Instructions per request of one gateway of checkout ``root``."""
    env: dict[str, str] = {}
    made = None
    if profile == "shared":
        made = f"ipinstr_{os.getpid()}_{name.replace('-', '_')}"
        create_database(server_dsn(), made)
        env["INFERPLANE_DATABASE_URL"] = dsn_for(server_dsn(), made)
        _migrate(env["INFERPLANE_DATABASE_URL"], None if root == ROOT else root)
    try:
        config = _gateway_config(work, name, upstream, shared=profile == "shared")
        headers = {"authorization": f"Bearer {_team_key(config, env or None)}",
                   "content-type": "application/json"}
        out = work / f"callgrind-{name}.out"
        proc, port = _serve(config, env, root, out)
        try:
            run_load(port, "/v1/chat/completions", body(sse), headers=headers, n=warmup,
                     concurrency=4, warmup=0)
            subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True,
                           capture_output=True)
            run_load(port, "/v1/chat/completions", body(sse), headers=headers, n=requests,
                     concurrency=4, warmup=0)
            subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True,
                           capture_output=True)
        finally:
            proc.terminate()
            proc.wait(60)
        return _dumped_total(out) / requests
    finally:
        if made is not None:
            drop_database(server_dsn(), made)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True,
                    help="another checkout (e.g. a git worktree of an earlier commit)")
    ap.add_argument("--profiles", default="local,shared",
                    help="comma-separated subset of local,shared")
    ap.add_argument("--sse", action="store_true", help="streamed answers (8 events)")
    ap.add_argument("--requests", type=int, default=1500, help="counted, at c=4")
    ap.add_argument("--warmup", type=int, default=200, help="before the counters are zeroed")
    args = ap.parse_args()
    kind = "SSE" if args.sse else "JSON"
    with tempfile.TemporaryDirectory(prefix="mayu-instr-") as tmp, \
            fast_upstream(Path(tmp), 8) as (upstream, _):
        for profile in args.profiles.split(","):
            counts = {name: measure(Path(tmp), upstream, profile, name, root, sse=args.sse,
                                    warmup=args.warmup, requests=args.requests)
                      for name, root in ((profile, ROOT),
                                         (f"{profile}-base", args.baseline.resolve()))}
            now, base = counts[profile], counts[f"{profile}-base"]
            print(f"{profile:7s} {kind}  instructions/request {now:,.0f}  baseline "
                  f"{base:,.0f}  x{now / base:.3f}  ({args.requests} requests at c=4)",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
