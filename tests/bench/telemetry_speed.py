"""Telemetry bench (a script, not a test): CPU per request of one ``mayu serve`` with
tracing off and one with tracing on (spans and OTLP metrics to a real receiver process,
``tests/e2e/otlp_receiver.py``), in the same run, against the same fast upstream
(``tests/bench/_fastup.py``) with the same load generator as ``speed.py``.

For JSON and SSE answers it prints, as medians over ``--rounds`` (the two gateways
alternate within each round, so the machine's load falls on both alike), the server's
CPU ms per request (user + system from ``/proc``, over ``--requests`` requests at
concurrency ``--concurrency``), req/s, and the ratio on/off; then the spans the receiver
got, against the requests made.

    .venv/bin/python tests/bench/telemetry_speed.py [--rounds 3] [--requests 2000]
        [--sample-ratio 1.0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench._loadgen import run_load  # noqa: E402
from tests.bench.speed import body, fast_upstream, mayu_local, tree_cpu  # noqa: E402
from tests.e2e._otlp import otlp_receiver  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sample-ratio", type=float, default=1.0,
                        help="telemetry.sample_ratio of the traced gateway")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="telemetry-bench-") as tmp:
        work = Path(tmp)
        with fast_upstream(work, 8) as (up_port, _), otlp_receiver(work) as receiver:
            off, off_gw = mayu_local(work, up_port, name="off")
            on, on_gw = mayu_local(work, up_port, name="on", overrides={
                "telemetry.endpoint": receiver.url, "telemetry.metrics_interval_s": 5.0,
                "telemetry.sample_ratio": args.sample_ratio})
            try:
                cpu: dict[tuple[str, str], list[float]] = {}
                rate: dict[tuple[str, str], list[float]] = {}
                sent = 0
                for _ in range(args.rounds):
                    for stream in (False, True):
                        kind = "SSE" if stream else "JSON"
                        for name, target in (("off", off), ("on", on)):
                            before = tree_cpu(target.pid)
                            result = run_load(target.port, target.path, body(stream),
                                              headers=target.headers, n=args.requests,
                                              concurrency=args.concurrency, warmup=100)
                            spent = tree_cpu(target.pid) - before
                            assert result.errors == 0, f"{name} {kind}: {result.errors} errors"
                            sent += (args.requests + 100) if name == "on" else 0
                            cpu.setdefault((name, kind), []).append(
                                spent * 1000 / (args.requests + 100))
                            rate.setdefault((name, kind), []).append(result.rate)
                print(f"{'answer':6} {'tracing':8} {'CPU ms/req':>11} {'req/s':>8}")
                for kind in ("JSON", "SSE"):
                    for name in ("off", "on"):
                        print(f"{kind:6} {name:8} {statistics.median(cpu[name, kind]):11.3f} "
                              f"{statistics.median(rate[name, kind]):8.0f}")
                    ratio = (statistics.median(cpu["on", kind])
                             / statistics.median(cpu["off", kind]))
                    print(f"{kind:6} on/off CPU ratio {ratio:.2f}")
                roots = [s for s in receiver.spans() if s["kind"] == 2]
                print(f"spans received: {len(receiver.spans())} ({len(roots)} request roots "
                      f"for {sent} traced requests; the rest dropped or still queued)")
            finally:
                off_gw.stop()
                on_gw.stop()


if __name__ == "__main__":
    main()
