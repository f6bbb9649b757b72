"""Speed bench (a script, not a test): CPU per request, throughput and overhead of one
gateway process — mayu local, mayu shared, and LiteLLM's proxy when it is installed —
against the same fake upstream, with the same load generator, in one run.

For every target and for JSON and SSE answers it prints, as medians over ``--rounds``
(targets alternate within each round, so the machine's load falls on all alike):

- req/s at concurrency ``--concurrency`` (closed loop, kept-alive connections), and the
  ratio to the upstream direct and to LiteLLM;
- p50 latency at concurrency 1 and the overhead over the upstream direct;
- CPU per request of the server process (user + system from ``/proc/<pid>/stat`` over
  both loads, divided by the requests), and for the shared profile the CPU of its
  Postgres backends per request;
- the server's RSS at the end, and its peak (VmHWM);
- for mayu, the store decisions one request's admission makes (``mayu_admission_seconds``
  observations): a normal request, one admitted after budget fit, one admitted after its
  input was refined by the provider's count (``docs/admission.md``, "Store decisions").

The upstream is ``tests/bench/_fastup.py`` (a raw asyncio server: tens of µs per
request), the client ``tests/bench/_loadgen.py`` (raw asyncio + httptools). The team
has limits (RPM, TPM, tokens and µUSD per day, all far above the load), so every
request is authenticated, admitted against four counters, relayed, metered, settled,
journaled and audited. LiteLLM runs from its own venv (``--litellm``, default
``/tmp/sp11/litellm-venv/bin/litellm``; ``pip install 'litellm[proxy]'`` there), one
worker, no database, its master key as the one credential; the bench says so when it is
absent.

    .venv/bin/python tests/bench/speed.py [--rounds 3] [--requests 3000] [--only local,shared]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench._bench import cpu_s, machine_ms, server_dsn  # noqa: E402
from tests.bench._loadgen import run_load  # noqa: E402
from tests.conftest import create_database, drop_database, dsn_for, migrate  # noqa: E402
from tests.e2e._procs import Proc, free_port, run_cli, start_gateway  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LIMITS = ("--rpm", "100000000", "--tpm", "60000000000", "--tokens-per-day",
          "1000000000000", "--usd-micros-per-day", "1000000000000000")
DEFAULT_LITELLM = "/tmp/sp11/litellm-venv/bin/litellm"


def body(stream: bool, max_tokens: int = 16) -> bytes:
    return (b'{"model":"mock-gpt","max_tokens":%d,"stream":%s,"messages":[{"role":"user",'
            b'"content":"say something short"}]}' % (max_tokens,
                                                      b"true" if stream else b"false"))


# -- /proc ---------------------------------------------------------------------------

def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children[ppid].append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def tree_cpu(pid: int) -> float:
    return sum(cpu_s(p) for p in tree(pid))


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MB, summed over the process tree."""
    rss = hwm = 0.0
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) / 1024
                elif line.startswith("VmHWM:"):
                    hwm += int(line.split()[1]) / 1024
        except OSError:
            pass
    return rss, hwm


# -- targets -------------------------------------------------------------------------

@dataclass
class Target:
    name: str
    port: int
    pid: int
    headers: dict[str, str]
    path: str = "/v1/chat/completions"
    backends: Callable[[], list[int]] | None = None
    """Postgres backend pids serving this target (shared profile)."""
    probes: dict[str, tuple[str, bytes, str]] = field(default_factory=dict)
    """mayu: the decision probes (normal, fitted, refined) → (path, body, key)."""


@dataclass
class Figures:
    rate: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    pg_ms: list[float] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)
    hwm: list[float] = field(default_factory=list)
    admit_ms: list[float] = field(default_factory=list)
    """mayu: mean admission call at c=1 (its ``mayu_admission_seconds`` histogram)."""
    settle_ms: list[float] = field(default_factory=list)
    """mayu: mean settlement call at c=1 (``mayu_settlement_seconds``)."""


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, path: str) -> None:
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"not ready:\n{log.read_text()[-3000:]}")


@contextmanager
def fast_upstream(work: Path, events: int) -> Iterator[tuple[int, int]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/bench/_fastup.py"), "--port",
                             str(port), "--events", str(events)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


def _gateway_config(work: Path, name: str, upstream: int, shared: bool,
                    overrides: dict[str, object] | None = None) -> Path:
    config: dict[str, Any] = {
        "data_dir": str(work / f"data-{name}"), "demo": False,
        "server": {"replica_id": name},
        "providers": [{"name": "up", "kind": "openai",
                       "base_url": f"http://127.0.0.1:{upstream}/v1"},
                      {"name": "mock", "kind": "mock"}],
        "models": [{"name": "mock-gpt", "deployments": [{"provider": "up"}],
                    "price": {"input": 1_000_000, "output": 4_000_000}},
                   # Only for the decision probes: the in-process mock counts input.
                   {"name": "mock-claude", "deployments": [{"provider": "mock"}],
                    "price": {"input": 1_000_000, "output": 4_000_000}}]}
    if shared:
        config.update({"key_store": {"type": "postgres"},
                       "governance_store": {"type": "postgres"},
                       "database": {"dsn_ref": "env:INFERPLANE_DATABASE_URL",
                                    "pool_min_size": 4, "pool_max_size": 16}})
    for dotted, value in (overrides or {}).items():
        *parents, leaf = dotted.split(".")
        node: Any = config
        for part in parents:  # a number indexes a list (the next index appends)
            if isinstance(node, list):
                if int(part) == len(node):
                    node.append({})
                node = node[int(part)]
            else:
                node = node.setdefault(part, {})
        if isinstance(node, list):
            node[int(leaf)] = value
        else:
            node[leaf] = value
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _team_key(config: Path, env: dict[str, str] | None, *, suffix: str = "",
              limits: tuple[str, ...] = LIMITS) -> str:
    import json
    team = f"bench-{config.stem}{suffix}"
    done = run_cli("teams", "create", team, "--config", str(config), "--json", *limits,
                   env=env)
    assert done.returncode == 0, done.stderr
    done = run_cli("keys", "create", "--team", team, "--config", str(config), "--json",
                   env=env)
    assert done.returncode == 0, done.stderr
    key: str = json.loads(done.stdout)["key"]
    return key


FIT_LIMITS = ("--usd-micros-per-day", "20000", "--budget-fit-floor", "16")
"""A chat request with max_tokens 8192 (a 33,000 µUSD worst case) is fitted to these."""
REFINE_LIMITS = ("--usd-micros-per-day", "10000")
"""18 KB of text to mock-claude does not fit these bounded by its bytes; counted it does."""


def _probes(config: Path, env: dict[str, str] | None,
            key: str) -> dict[str, tuple[str, bytes, str]]:
    """The decision probes' requests, each with a key of a team of its own."""
    refined = (b'{"model":"mock-claude","max_tokens":16,"messages":[{"role":"user",'
               b'"content":"' + b"hello " * 3000 + b'"}]}')
    return {"normal": ("/v1/chat/completions", body(False), key),
            "fitted": ("/v1/chat/completions", body(False, 8192),
                       _team_key(config, env, suffix="-fit", limits=FIT_LIMITS)),
            "refined": ("/v1/messages", refined,
                        _team_key(config, env, suffix="-refine", limits=REFINE_LIMITS))}


def decisions(t: Target) -> dict[str, str]:
    """Store decisions each probe's admission made (its ``mayu_admission_seconds``
    observations), with the answer's status when it is not 200."""
    def count() -> float:
        text = httpx.get(f"http://127.0.0.1:{t.port}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("mayu_admission_seconds_count"):
                return float(line.split()[-1])
        return 0.0
    out = {}
    for name, (path, payload, key) in t.probes.items():
        before = count()
        r = httpx.post(f"http://127.0.0.1:{t.port}{path}", content=payload, timeout=30,
                       headers={"authorization": f"Bearer {key}",
                                "content-type": "application/json"})
        made = count() - before
        out[name] = f"{made:.0f}" + ("" if r.status_code == 200 else f" ({r.status_code})")
    return out


def _migrate(dsn: str, root: Path | None) -> None:
    """Migrate with this checkout's migrations, or another one's (``--baseline``)."""
    if root is None:
        migrate(dsn)
        return
    full = {**os.environ, "INFERPLANE_DATABASE_URL": dsn, "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-m", "gateway", "migrate"], env=full, cwd=str(root),
                   check=True, capture_output=True)


def _start(config: Path, env: dict[str, str] | None, root: Path | None) -> Proc:
    """``mayu serve`` from this checkout, or from another one (``--baseline``)."""
    if root is None:
        return start_gateway(config, env=env)
    port = free_port()
    log = config.parent / f"gateway-{port}.log"
    full = {**os.environ, **(env or {}), "PYTHONPATH": str(root)}
    popen = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config",
                              str(config), "--port", str(port), "--log-level", "warning"],
                             stdout=log.open("wb"), stderr=subprocess.STDOUT, env=full,
                             cwd=str(root))
    _wait_port(port, popen, log, "/readyz")
    return Proc(popen=popen, port=port, log_path=log)


def mayu_local(work: Path, upstream: int, *, root: Path | None = None,
               name: str = "local", overrides: dict[str, object] | None = None
               ) -> tuple[Target, Proc]:
    config = _gateway_config(work, name, upstream, shared=False, overrides=overrides)
    key = _team_key(config, None)
    probes = _probes(config, None, key)
    gw = _start(config, None, root)
    return Target(f"mayu {name}", gw.port, gw.popen.pid,
                  {"authorization": f"Bearer {key}"}, probes=probes), gw


def mayu_shared(work: Path, upstream: int, dsn: str, *, root: Path | None = None,
                name: str = "shared", overrides: dict[str, object] | None = None
                ) -> tuple[Target, Proc]:
    env = {"INFERPLANE_DATABASE_URL": dsn}
    config = _gateway_config(work, name, upstream, shared=True, overrides=overrides)
    key = _team_key(config, env)
    probes = _probes(config, env, key)
    gw = _start(config, env, root)
    dbname = dsn.rsplit("/", 1)[1]

    def backends() -> list[int]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s"
                                " AND pid <> pg_backend_pid()", (dbname,)).fetchall()
        return [int(r[0]) for r in rows]
    return Target(f"mayu {name}", gw.port, gw.popen.pid,
                  {"authorization": f"Bearer {key}"}, backends=backends,
                  probes=probes), gw


def litellm(work: Path, upstream: int, exe: str) -> tuple[Target, subprocess.Popen[bytes]]:
    config = work / "litellm.yaml"
    config.write_text(yaml.safe_dump({
        "model_list": [{"model_name": "mock-gpt", "litellm_params": {
            "model": "openai/mock-gpt", "api_base": f"http://127.0.0.1:{upstream}/v1",
            "api_key": "sk-fake"}}],
        "litellm_settings": {"telemetry": False, "drop_params": True},
    }))
    port = free_port()
    log = work / "litellm.log"
    master = "sk-bench-" + "0123456789abcdef" * 4  # LiteLLM refuses to start without one
    env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False",
           "LITELLM_MASTER_KEY": master}
    proc = subprocess.Popen([exe, "--config", str(config), "--port", str(port),
                             "--num_workers", "1"], stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, env=env, cwd=str(work))
    _wait_port(port, proc, log, "/health/liveliness")
    return Target("litellm", port, proc.pid, {"authorization": f"Bearer {master}"}), proc


# -- measuring -----------------------------------------------------------------------

def histograms(t: Target) -> dict[str, tuple[float, float]] | None:
    """mayu's admission and settlement histograms: name -> (sum s, count); None for a
    target that is not mayu."""
    if not t.name.startswith("mayu"):
        return None
    text = httpx.get(f"http://127.0.0.1:{t.port}/metrics", timeout=10).text
    found: dict[str, list[float]] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        for metric in ("mayu_admission_seconds", "mayu_settlement_seconds"):
            if name in (f"{metric}_sum", f"{metric}_count"):
                found.setdefault(metric, [0.0, 0.0])[name.endswith("_count")] = float(value)
    return {k: (v[0], v[1]) for k, v in found.items()}


def _mean_ms(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]],
             metric: str) -> float:
    (s0, n0), (s1, n1) = before.get(metric, (0.0, 0.0)), after.get(metric, (0.0, 0.0))
    return (s1 - s0) / (n1 - n0) * 1000 if n1 > n0 else float("nan")


def measure(t: Target, stream: bool, args: argparse.Namespace, figures: Figures) -> None:
    pg_before = {p: cpu_s(p) for p in t.backends()} if t.backends else {}
    before = tree_cpu(t.pid)
    hot = run_load(t.port, t.path, body(stream), headers=t.headers, n=args.requests,
                   concurrency=args.concurrency)
    calls = histograms(t)
    one = run_load(t.port, t.path, body(stream), headers=t.headers, n=args.requests_c1,
                   concurrency=1, warmup=20)
    if calls is not None:  # the c=1 load alone (its warm-up included)
        after_c1 = histograms(t) or {}
        figures.admit_ms.append(_mean_ms(calls, after_c1, "mayu_admission_seconds"))
        figures.settle_ms.append(_mean_ms(calls, after_c1, "mayu_settlement_seconds"))
    n = args.requests + args.requests_c1 + 200 + 20
    for r in (hot, one):
        if r.errors:
            raise RuntimeError(f"{t.name}: {r.errors} failed requests; first: {r.first_error}")
    figures.rate.append(hot.rate)
    figures.p50.append(one.pct(50))
    figures.cpu_ms.append((tree_cpu(t.pid) - before) / n * 1000)
    if t.backends:
        after = {p: cpu_s(p) for p in t.backends()}
        figures.pg_ms.append(sum(after[p] - pg_before.get(p, 0.0) for p in after) / n * 1000)
    rss, hwm = rss_mb(t.pid)
    figures.rss.append(rss)
    figures.hwm.append(hwm)


def long_streams(t: Target, events: int) -> list[tuple[int, float, float, float]]:
    """One stream of ``events // 10`` content events, then one of ``events``: for each,
    (events, RSS before in MB, peak RSS while it streamed, seconds). A stream's memory
    is independent of its length when the two peaks match."""
    out = []
    for n in (events // 10, events):
        before = rss_mb(t.pid)[0]
        peak, done = before, threading.Event()

        def sample(done: threading.Event = done) -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, rss_mb(t.pid)[0])
                time.sleep(0.01)
        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.perf_counter()
        try:
            r = run_load(t.port, t.path, body(True, n), headers=t.headers, n=1,
                         concurrency=1, warmup=0)
        finally:
            done.set()
            sampler.join()
        if r.errors:
            raise RuntimeError(f"{t.name}: long stream failed: {r.first_error}")
        out.append((n, before, peak, time.perf_counter() - started))
    return out


def report(results: dict[tuple[str, bool], Figures], names: list[str],
           args: argparse.Namespace) -> None:
    med = statistics.median
    for stream in (False, True):
        if not any(f.rate for (_, st), f in results.items() if st == stream):
            continue
        print(f"\n{'SSE stream' if stream else 'JSON'} ({args.events} content events)"
              if stream else "\nJSON")
        print(f"{'target':<12} {'req/s c=' + str(args.concurrency):>11} {'x direct':>9} "
              f"{'x litellm':>10} {'p50 c=1':>8} {'overhead':>9} {'CPU/req':>8} "
              f"{'PG/req':>7} {'RSS':>6} {'peak':>6}")
        direct = results.get(("direct", stream))
        lite = results.get(("litellm", stream))
        for name in names:
            f = results.get((name, stream))
            if f is None or not f.rate:
                continue
            rate = med(f.rate)
            xd = rate / med(direct.rate) if direct else float("nan")
            xl = rate / med(lite.rate) if lite and lite.rate else float("nan")
            over = med(f.p50) - med(direct.p50) if direct else float("nan")
            pg = f"{med(f.pg_ms):7.3f}" if f.pg_ms else f"{'-':>7}"
            print(f"{name:<12} {rate:11.0f} {xd:9.3f} {xl:10.2f} {med(f.p50):7.2f}ms "
                  f"{over:+8.2f}ms {med(f.cpu_ms):7.3f}ms {pg} {med(f.rss):5.0f}M "
                  f"{max(f.hwm):5.0f}M")
        calls = [(name, f) for name in names
                 if (f := results.get((name, stream))) is not None and f.admit_ms]
        if calls:
            print("at c=1, the governance calls in each request's path (mean per call, "
                  "from mayu's own histograms; the answer waits for the admission, and "
                  "for the settlement only where server.settle_wait_s > 0):")
        for name, f in calls:
            a, st = med(f.admit_ms), med(f.settle_ms)
            print(f"  {name:<16} admission {a:6.3f} ms  settlement {st:6.3f} ms  "
                  f"together {a + st:6.3f} ms")


def per_worker(work: Path, name: str) -> list[int]:
    """Requests admitted by each worker of target ``name`` (its audit files' ``admitted``
    lines; one count for a single process, none for a target that is not mayu)."""
    target = name.removeprefix("mayu ")
    files = sorted((work / f"data-{target}").glob(f"audit-{target}-*.jsonl"))
    return [sum(1 for line in f.open("rb") if b'"event":"admitted"' in line)
            for f in files]


def variant(text: str) -> tuple[str, str, dict[str, object]]:
    """``NAME=PROFILE[,KEY=VALUE...]`` (``--variant``) → (name, profile, settings)."""
    name, _, rest = text.partition("=")
    profile, *settings = rest.split(",")
    if not name or profile not in ("local", "shared") or not all("=" in s for s in settings):
        raise argparse.ArgumentTypeError(
            f"{text!r}: NAME=local|shared[,dotted.key=value...] expected")
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in settings)}
    return name, profile, overrides


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=3000, help="per load at concurrency N")
    ap.add_argument("--requests-c1", type=int, default=500, help="per load at concurrency 1")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--events", type=int, default=8, help="content events per stream")
    ap.add_argument("--only", default="direct,local,shared,litellm",
                    help="comma-separated subset of direct,local,shared,litellm")
    ap.add_argument("--litellm", default=DEFAULT_LITELLM, help="the litellm executable")
    ap.add_argument("--no-stream", action="store_true", help="JSON answers only")
    ap.add_argument("--long-events", type=int, default=100_000,
                    help="the long-stream memory check: streams of N/10 and N content "
                         "events through each target after the rounds (0: skip)")
    ap.add_argument("--variant", action="append", default=[], type=variant,
                    metavar="NAME=PROFILE[,KEY=VALUE...]",
                    help="one more mayu target: the local or shared profile with these "
                         "config settings (dotted keys, YAML values), e.g. "
                         "'answer-first=shared,server.settle_wait_s=0'; repeatable")
    ap.add_argument("--baseline", type=Path, help="another checkout (e.g. a git worktree "
                    "of the previous commit): its mayu local/shared run next to this one's")
    ap.add_argument("--variant-baseline", action="store_true",
                    help="run each --variant from the --baseline checkout too "
                         "(NAME-base)")
    args = ap.parse_args()
    if args.variant_baseline and args.baseline is None:
        ap.error("--variant-baseline needs --baseline")
    only = set(args.only.split(","))
    load0, speed0 = os.getloadavg()[0], machine_ms()
    server = server_dsn()
    dbname = f"ipspeed_{os.getpid()}"
    procs: list[Proc] = []
    others: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="mayu-speed-") as tmp, \
            fast_upstream(Path(tmp), args.events) as (up_port, up_pid):
        work = Path(tmp)
        targets: list[Target] = []
        made_dbs: list[str] = []
        try:
            if "direct" in only:
                targets.append(Target("direct", up_port, up_pid, {}))
            if "local" in only:
                for name, root in (("local", None), ("local-base", args.baseline)):
                    if name == "local" or root is not None:
                        t, p = mayu_local(work, up_port, root=root, name=name)
                        targets.append(t)
                        procs.append(p)

            def fresh_dsn(root: Path | None) -> str:
                """A database of its own, migrated by its own checkout (a gateway refuses
                a schema newer than its own head)."""
                db = f"{dbname}_{len(made_dbs)}"
                create_database(server, db)
                made_dbs.append(db)
                dsn = dsn_for(server, db)
                _migrate(dsn, root)
                return dsn
            if "shared" in only:
                for name, root in (("shared", None), ("shared-base", args.baseline)):
                    if name == "shared" or root is not None:
                        t, p = mayu_shared(work, up_port, fresh_dsn(root), root=root,
                                           name=name)
                        targets.append(t)
                        procs.append(p)
            for name, profile, overrides in args.variant:
                for vname, root in ((name, None), (f"{name}-base", args.baseline)):
                    if root is not None and not args.variant_baseline:
                        continue
                    if profile == "local":
                        t, p = mayu_local(work, up_port, root=root, name=vname,
                                          overrides=overrides)
                    else:
                        t, p = mayu_shared(work, up_port, fresh_dsn(root), root=root,
                                           name=vname, overrides=overrides)
                    targets.append(t)
                    procs.append(p)
            if "litellm" in only:
                if Path(args.litellm).exists():
                    t, lp = litellm(work, up_port, args.litellm)
                    targets.append(t)
                    others.append(lp)
                else:
                    print(f"litellm: not installed at {args.litellm} (python -m venv DIR && "
                          "DIR/bin/pip install 'litellm[proxy]', then --litellm "
                          "DIR/bin/litellm): its figures are left out")
            results: dict[tuple[str, bool], Figures] = defaultdict(Figures)
            longs: dict[str, list[tuple[int, float, float, float]]] = {}
            modes = (False,) if args.no_stream else (False, True)
            for rnd in range(args.rounds):
                for stream in modes:
                    for t in targets:
                        measure(t, stream, args, results[(t.name, stream)])
                print(f"round {rnd + 1}/{args.rounds} done, load average "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
            longs.update({t.name: long_streams(t, args.long_events) for t in targets
                          if args.long_events and t.name != "direct"})
            served = {t.name: per_worker(work, t.name) for t in targets}
            decided = {t.name: decisions(t) for t in targets if t.probes}
        finally:
            for p in procs:
                p.stop()
            for o in others:
                o.terminate()
                try:
                    o.wait(10)
                except subprocess.TimeoutExpired:
                    o.kill()
            for db in made_dbs:
                drop_database(server, db)
    print(f"\n{os.cpu_count()} cores; load average {load0:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end; machine {speed0:.0f} -> {machine_ms():.0f} ms "
          f"per probe loop (tests/bench/_bench.py machine_ms); medians of {args.rounds} rounds; "
          f"{args.requests} requests at c={args.concurrency} and {args.requests_c1} at c=1 "
          "per round; CPU/req = server process user+sys over both loads")
    report(results, [t.name for t in targets], args)
    if decided:
        print("\nstore decisions per request's admission (mayu_admission_seconds "
              "observations; docs/admission.md, \"Store decisions\"):")
        for name, made in decided.items():
            print(f"  {name:<16} " + "  ".join(f"{k} {v}" for k, v in made.items()))
    spread = {name: counts for name, counts in served.items() if len(counts) > 1}
    if spread:
        print("\nrequests admitted per worker (server.workers > 1; the kernel's spread of "
              "the load generator's connections):")
        for name, counts in spread.items():
            print(f"  {name:<16} " + " / ".join(f"{c:,}" for c in counts))
    if longs:
        print("\nlong streams (one at a time): RSS before -> peak while streaming, time")
        for name, rows in longs.items():
            print(f"{name:<17} " + "   ".join(
                f"{n:>7} events: {before:4.0f} -> {peak:4.0f} MB in {secs:5.1f} s"
                for n, before, peak, secs in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
