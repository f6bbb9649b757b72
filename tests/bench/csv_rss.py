"""The gateway's memory while it exports the request log as CSV, from one run.

Fills a scratch database with N settled permits (tests/bench/requestlog.py's fill), starts
a real shared-profile ``mayu serve`` on it, and reads ``/admin/v1/requests.csv`` (every
row, a read admin token) as a client would, discarding it as it comes. Prints the
gateway's resident memory (``VmRSS`` of /proc) before the export, its peak while the
export runs (sampled every 50 ms), after it, the rows and bytes read and the time::

    .venv/bin/python tests/bench/csv_rss.py [--n 1000000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench._bench import own_database  # noqa: E402
from tests.bench.requestlog import fill  # noqa: E402
from tests.e2e._procs import start_gateway  # noqa: E402

TOKEN = "bench-csv-export-read-token"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def run(dsn: str, n: int) -> None:
    fill(dsn, n, datetime.now(UTC) - timedelta(days=30))
    with tempfile.TemporaryDirectory() as work:
        config = Path(work) / "gw.yaml"
        config.write_text(yaml.safe_dump({
            "data_dir": work, "demo": False,
            "server": {"admin_tokens": [{"name": "bench", "token_ref": "env:IPT_BENCH"}]},
            "key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
            "database": {"dsn_ref": "env:INFERPLANE_DATABASE_URL", "pool_min_size": 1,
                         "pool_max_size": 4, "statement_timeout_s": 60}}))
        gw = start_gateway(config, env={"INFERPLANE_DATABASE_URL": dsn, "IPT_BENCH": TOKEN})
        try:
            pid = gw.popen.pid
            headers = {"Authorization": f"Bearer {TOKEN}"}
            # One small page first, so the pool, the routes and the query plans are warm.
            httpx.get(f"{gw.url}/admin/v1/requests?limit=10", headers=headers, timeout=60)
            before = rss_mb(pid)
            peak, done = before, threading.Event()

            def sample() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, rss_mb(pid))
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample)
            sampler.start()
            t, size, lines = time.perf_counter(), 0, 0
            with httpx.stream("GET", f"{gw.url}/admin/v1/requests.csv", headers=headers,
                              timeout=600) as r:
                assert r.status_code == 200, r.read()[:300]
                for chunk in r.iter_bytes():
                    size += len(chunk)
                    lines += chunk.count(b"\n")
            spent = time.perf_counter() - t
            done.set()
            sampler.join()
            after = rss_mb(pid)
        finally:
            gw.stop()
    print(f"requests.csv over {n} permits: {lines - 1} rows, {size / 2**20:.0f} MiB in "
          f"{spent:.1f} s; gateway RSS {before:.0f} MB before, peak {peak:.0f} MB "
          f"(+{peak - before:.1f}), {after:.0f} MB after", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="permits to fill (1000000)")
    args = ap.parse_args()
    with own_database("bench_csvrss") as dsn:
        run(dsn, args.n)


if __name__ == "__main__":
    main()
