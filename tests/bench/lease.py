"""Lease-profile benchmark (a script, not a test): three figures from one run.

1. **Overhead**: the same load through a local-profile gateway (the policy in a file)
   and through a lease-profile gateway (the same policy from inferplaned, under a lease),
   both in front of ``mayu mock-upstream``, in alternating rounds; p50/p99/mean latency,
   throughput and gateway CPU per request of each. The lease adds no network call to
   the request path, so the two should be equal within noise.
2. **Spendable budget** (issue 25): three lease planes (and a shared-profile gateway
   with ``--shared``) on one global hard budget of ``--bounds`` request bounds, a
   concurrent workload until every client is refused 402 ten times in a row; per grant
   size (``--grants``, per mille of the limit): the share of the limit the mock
   upstream served (its own ledger), and the 200s, 503s, 402s and heartbeats seen.
3. **Control-plane CPU per heartbeat**: synthetic heartbeats straight to inferplaned
   (a data plane token, 1, 10 and 100 accounts each): inferplaned's own CPU per
   heartbeat, the CPU of its Postgres backends (when the server runs on this machine:
   their /proc entries), and the round-trip time.

    .venv/bin/python tests/bench/lease.py [--requests 1000] [--concurrency 16]
        [--rounds 3] [--heartbeats 300] [--only spendable --bounds 10 --shared]

Needs the test Postgres (``INFERPLANE_TEST_PG_DSN``, default the local server); a fresh
migrated database is created for the run and dropped after it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench._bench import cpu_s, own_database  # noqa: E402
from tests.e2e._lease import (  # noqa: E402
    DATAPLANE_TOKEN,
    MODEL,
    PRICE,
    LeaseStack,
    budget_doc,
    chat,
    race,
    shared_key,
    start_shared,
    upstream_spend,
    wait_until,
)
from tests.e2e._procs import (  # noqa: E402
    Proc,
    create_key,
    create_team,
    start_gateway,
    start_mock_upstream,
)

TEAM = "bench"


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] * 1000


async def _load(base: str, key: str, *, n: int, concurrency: int) -> tuple[list[float], float]:
    body = {"model": MODEL, "max_tokens": 16,
            "messages": [{"role": "user", "content": "say something short"}]}
    latencies: list[float] = []
    todo = list(range(n))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60,
                                 headers={"Authorization": f"Bearer {key}"}) as client:
        async def worker() -> None:
            while todo:
                todo.pop()
                t0 = time.perf_counter()
                r = await client.post("/v1/chat/completions", json=body)
                if r.status_code != 200:
                    raise RuntimeError(f"{r.status_code}: {r.text}")
                latencies.append(time.perf_counter() - t0)

        for _ in range(50):
            await client.post("/v1/chat/completions", json=body)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


def overhead(work: Path, dsn: str, args: argparse.Namespace) -> None:
    upstream = start_mock_upstream(work)
    stack = LeaseStack(workdir=work / "overhead", dsn=dsn)
    stack.workdir.mkdir()
    local: Proc | None = None
    doc = budget_doc("bench", "*", limit_milli=10**9, grant_milli=10**8, renew="10s")
    try:
        stack.start_control()
        stack.publish(doc)
        stack.add_plane("lease", teams=[TEAM], upstream=upstream)
        policy = work / "policy.yaml"
        policy.write_text(yaml.safe_dump(doc))
        config = work / "local.yaml"
        config.write_text(yaml.safe_dump({
            "data_dir": str(work / "local"), "demo": False, "policies": [str(policy)],
            "providers": [{"name": "up", "kind": "openai", "base_url": f"{upstream.url}/v1"}],
            "models": [{"name": MODEL, "price": PRICE, "input_overhead_tokens": 0,
                        "deployments": [{"provider": "up", "upstream_model": "mock-gpt"}]}]}))
        create_team(config, TEAM)
        local_key = create_key(config, TEAM)
        local = start_gateway(config)
        lease = stack.planes["lease"]
        wait_until(lambda: httpx.post(f"{lease.url}/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
            headers={"Authorization": f"Bearer {stack.keys[('lease', TEAM)]}"}
        ).status_code == 200, what="lease plane serving")
        targets = {"local": (local, local_key), "lease": (lease, stack.keys[("lease", TEAM)])}
        lat: dict[str, list[float]] = {"local": [], "lease": []}
        wall = dict.fromkeys(lat, 0.0)
        cpu = dict.fromkeys(lat, 0.0)
        for _ in range(args.rounds):
            for name, (proc, key) in targets.items():
                before = cpu_s(proc.popen.pid)
                got, seconds = asyncio.run(_load(proc.url, key, n=args.requests,
                                                 concurrency=args.concurrency))
                cpu[name] += cpu_s(proc.popen.pid) - before
                lat[name] += got
                wall[name] += seconds
    finally:
        if local is not None:
            local.stop()
        stack.stop()
        upstream.stop()
    print(f"\n1. overhead: {args.rounds} alternating rounds x {args.requests} requests, "
          f"concurrency {args.concurrency}, mock-upstream over HTTP")
    print(f"{'profile':8} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'req/s':>8} "
          f"{'CPU ms/req':>11}")
    for name in lat:
        n = len(lat[name])
        print(f"{name:8} {_pct(lat[name], 50):8.2f} {_pct(lat[name], 99):8.2f} "
              f"{statistics.mean(lat[name]) * 1000:8.2f} {n / wall[name]:8.0f} "
              f"{cpu[name] / (n + 50 * args.rounds) * 1000:11.3f}")
    print(f"lease - local: p50 {_pct(lat['lease'], 50) - _pct(lat['local'], 50):+.2f} ms, "
          f"mean {(statistics.mean(lat['lease']) - statistics.mean(lat['local'])) * 1000:+.2f}"
          f" ms; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


def spendable(work: Path, args: argparse.Namespace) -> None:
    """Issue 25's measure: a budget of ``--bounds`` times one request's bound, spent by
    three planes (and a shared gateway with ``--shared``), ``--workers`` concurrent
    clients each, until every client is refused 402 ten times in a row; what the mock
    upstream served (its own ledger) as a share of the limit, per grant size."""
    who = "3 planes" + (" + a shared gateway" if args.shared else "")
    print(f"\n2. spendable budget: {who} x {args.workers} workers, limit = "
          f"{args.bounds} x one request's bound")
    print(f"{'grant':>6} {'bound':>7} {'limit':>8} {'spent':>8} {'share':>7} {'503s':>6} "
          f"{'200s':>6} {'402s':>6} {'heartbeats':>10}")
    for per_mille in args.grants:
        with own_database(f"ipt_bench_{per_mille}") as dsn:
            upstream = start_mock_upstream(work)
            stack = LeaseStack(workdir=work / f"spend-{per_mille}", dsn=dsn)
            stack.workdir.mkdir()
            shared: Proc | None = None
            try:
                stack.start_control()
                planes = ["p1", "p2", "p3"]
                for p in planes:
                    stack.add_plane(p, teams=[TEAM, "probe"], upstream=upstream)
                # One request of a team without a budget gives the bound of every request.
                probe = chat(stack.planes["p1"].url, stack.keys[("p1", "probe")],
                             max_tokens=args.max_tokens)
                assert probe.status_code == 200, probe.text
                bound = stack.largest_bound("p1")
                before = upstream_spend(upstream)
                limit_milli = -(-args.bounds * bound // 1000)
                limit = limit_milli * 1000
                stack.publish(budget_doc("bench", TEAM, limit_milli=limit_milli,
                                         grant_milli=max(1, limit_milli * per_mille // 1000)))
                targets = [(stack.planes[p].url, stack.keys[(p, TEAM)]) for p in planes]
                if args.shared:
                    shared, config = start_shared(stack.workdir, dsn, upstream=upstream)
                    targets.append((shared.url, shared_key(config, dsn, TEAM)))
                wait_until(functools.partial(_applied, stack, planes),
                           what="the budget applied")
                seen = race(targets, workers=args.workers, max_tokens=args.max_tokens)
                spent = upstream_spend(upstream) - before
                beats = sum(v["heartbeats"] for v in stack.dataplanes().values())
            finally:
                if shared is not None:
                    shared.stop()
                stack.stop()
                upstream.stop()
        print(f"{per_mille / 10:5.1f}% {bound:7} {limit:8} {spent:8} "
              f"{100 * spent / limit:6.1f}% {seen.get(503, 0):6} {seen.get(200, 0):6} "
              f"{seen.get(402, 0):6} {beats:10}")


def _applied(stack: LeaseStack, planes: list[str]) -> bool:
    return all(stack.applied_generation(p) == 1 for p in planes)


def heartbeat_cpu(work: Path, dsn: str, args: argparse.Namespace) -> None:
    stack = LeaseStack(workdir=work / "cpu", dsn=dsn)
    stack.workdir.mkdir()
    print(f"\n3. control-plane CPU per heartbeat ({args.heartbeats} heartbeats each, one "
          "plane at a time): inferplaned's process, and its Postgres backends")
    print(f"{'accounts':>8} {'CPU ms':>8} {'PG CPU ms':>10} {'p50 rtt ms':>11} "
          f"{'p99 rtt ms':>11}")
    try:
        stack.start_control()
        stack.publish(budget_doc("bench", "*", limit_milli=10**6, grant_milli=10))
        assert stack.control is not None
        pid = stack.control.popen.pid
        with httpx.Client(base_url=stack.control_url, timeout=30, headers={
                "Authorization": f"Bearer {DATAPLANE_TOKEN}"}) as client:
            day = client.post("/v1alpha1/sync", json=_beat(0, [], "")).json()["day"]
            for n in (1, 10, 100):
                accounts = [{"key": f"account:bench/spend:team=t{i}:day:{day}",
                             "rule_uid": "bench/spend", "committed": 1000 + i}
                            for i in range(n)]
                fp = client.post("/v1alpha1/sync", json=_beat(1, accounts, "")).json()[
                    "fingerprint"]
                rtt: list[float] = []
                backends = _backends(dsn)
                before, pg_before = cpu_s(pid), _cpu_many(backends)
                for seq in range(args.heartbeats):
                    t0 = time.perf_counter()
                    r = client.post("/v1alpha1/sync", json=_beat(seq + 2, accounts, fp))
                    rtt.append(time.perf_counter() - t0)
                    r.raise_for_status()
                used, pg_used = cpu_s(pid) - before, _cpu_many(backends) - pg_before
                print(f"{n:8} {used / args.heartbeats * 1000:8.2f} "
                      f"{pg_used / args.heartbeats * 1000:10.2f} {_pct(rtt, 50):11.2f} "
                      f"{_pct(rtt, 99):11.2f}")
    finally:
        stack.stop()


def _backends(dsn: str) -> list[int]:
    """inferplaned's Postgres backend pids (its pool's connections)."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity"
                            " WHERE application_name = 'inferplaned'").fetchall()
    return [r[0] for r in rows if Path(f"/proc/{r[0]}/stat").exists()]


def _cpu_many(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):  # a backend gone (the pool recycled it)
            total += cpu_s(pid)
    return total


def _beat(seq: int, accounts: list[dict[str, Any]], fingerprint: str) -> dict[str, Any]:
    return {"dataplane": {"id": "bench-plane", "api_versions": ["inferplane.dev/v1alpha1"]},
            "frame": "bench-frame", "boot": _BOOT, "seq": seq, "fingerprint": fingerprint,
            "accounts": accounts}


_BOOT = uuid.uuid4().hex


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--heartbeats", type=int, default=300)
    ap.add_argument("--bounds", type=int, default=10,
                    help="spendable: the budget, in request bounds")
    ap.add_argument("--workers", type=int, default=4,
                    help="spendable: concurrent clients per gateway")
    ap.add_argument("--max-tokens", type=int, default=50,
                    help="spendable: max_tokens of each request (sets its bound)")
    ap.add_argument("--grants", type=int, nargs="+", default=[1, 100],
                    help="spendable: lease.grant sizes, per mille of the limit")
    ap.add_argument("--shared", action="store_true",
                    help="spendable: a shared-profile gateway spends the budget too")
    ap.add_argument("--only", choices=["overhead", "spendable", "cpu"])
    args = ap.parse_args()
    with own_database("ipt_bench") as dsn, \
            tempfile.TemporaryDirectory(prefix="mayu-lease-bench-") as tmp:
        if args.only in (None, "overhead"):
            overhead(Path(tmp), dsn, args)
        if args.only in (None, "spendable"):
            spendable(Path(tmp), args)
        if args.only in (None, "cpu"):
            heartbeat_cpu(Path(tmp), dsn, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
