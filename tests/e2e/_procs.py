"""Real processes for end-to-end tests: ``mayu serve`` and ``mayu mock-upstream`` (alone,
as :func:`upstream_and_gateway`, or as :func:`shared_replicas`), the Bedrock peer and a
header tap (:mod:`tests.e2e._tcpproxy`).

Each process runs from this checkout's interpreter on a free port with its output in a
log file; :func:`wait_ready` polls ``/readyz`` and fails with the log if the process
exits first. :meth:`Proc.stop` terminates (then kills) it; fixtures call it in their
finalizers so no test leaves a process behind. :func:`wait_none_pending` waits for the
shared database to have taken the settlements of answers already received.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def recv_head(sock: socket.socket) -> bytes:
    """What ``sock`` receives until an HTTP head has ended (``\\r\\n\\r\\n``) or the peer
    closed: the bytes read (after the head, the start of a body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            break
        data += more
    return data


def mayu_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway", *args]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        terminate(self.popen)


def terminate(popen: subprocess.Popen[bytes]) -> None:
    """Stop ``popen`` if it runs: terminate, then kill after 10 s."""
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(timeout=10)


def start(args: list[str], *, port: int, log_path: Path,
          env: dict[str, str] | None = None) -> Proc:
    log = log_path.open("wb")
    popen = subprocess.Popen(mayu_cmd(*args), stdout=log, stderr=subprocess.STDOUT,
                             env=_env(env), cwd=str(log_path.parent))
    log.close()
    return Proc(popen=popen, port=port, log_path=log_path)


def wait_ready(proc: Proc, *, deadline_s: float = 60.0) -> Proc:
    """Poll /readyz until 200; raise with the process log if it exits or never answers."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"process exited with {proc.popen.returncode}:\n{proc.logs()}")
        try:
            if httpx.get(f"{proc.url}/readyz", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.stop()
    raise RuntimeError(f"process not ready after {deadline_s}s:\n{proc.logs()}")


def start_mock_upstream(workdir: Path, *, latency_ms: int = 0) -> Proc:
    port = free_port()
    proc = start(["mock-upstream", "--port", str(port), "--latency-ms", str(latency_ms)],
                 port=port, log_path=workdir / f"mock-upstream-{port}.log")
    return wait_ready(proc)


@pytest.fixture
def upstream_proc(tmp_path: Path) -> Iterator[Proc]:
    """A ``mayu mock-upstream`` for one test (a module takes it as ``upstream =
    upstream_proc``)."""
    proc = start_mock_upstream(tmp_path)
    try:
        yield proc
    finally:
        proc.stop()


@contextmanager
def header_tap(target_port: int, tap_file: Path) -> Iterator[int]:
    """A :mod:`tests.e2e._tcpproxy` in front of ``target_port`` writing what passes through
    to ``tap_file`` (``--tap``): its port; stopped afterwards."""
    port = free_port()
    tap = subprocess.Popen([sys.executable, "-m", "tests.e2e._tcpproxy", str(port),
                            "127.0.0.1", str(target_port), "--tap", str(tap_file)],
                           env=_env(), cwd=str(ROOT), stdout=subprocess.DEVNULL)
    try:
        yield port
    finally:
        terminate(tap)


def start_bedrock_peer(log_dir: Path, *args: str, region: str) -> tuple[Proc, str]:
    """``tests/e2e/_bedrock_peer.py`` (a Bedrock runtime of ``region`` and its STS) with
    ``args``, run in ``log_dir``, its log there; ready: (proc, STS URL)."""
    port, sts = free_port(), free_port()
    peer = Path(__file__).with_name("_bedrock_peer.py")
    log_path = log_dir / f"bedrock-peer-{port}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen([sys.executable, str(peer), "--port", str(port),
                                  "--sts-port", str(sts), "--region", region, *args],
                                 stdout=log, stderr=subprocess.STDOUT, cwd=log_dir)
    return wait_ready(Proc(popen=popen, port=port, log_path=log_path)), f"http://127.0.0.1:{sts}"


def start_gateway(config: Path, *, env: dict[str, str] | None = None) -> Proc:
    port = free_port()
    proc = start(["serve", "--config", str(config), "--port", str(port),
                  "--log-level", "warning"], port=port,
                 log_path=config.parent / f"gateway-{port}.log", env=env)
    return wait_ready(proc)


@contextmanager
def upstream_and_gateway(workdir: Path, config: Callable[[Proc], Path], *,
                         env: dict[str, str] | None = None
                         ) -> Iterator[tuple[Proc, Proc, Path]]:
    """A mock upstream and a gateway serving ``config(upstream)`` (a config file it
    writes): (gateway, upstream, config path); both stopped afterwards."""
    upstream = start_mock_upstream(workdir)
    try:
        path = config(upstream)
        gateway = start_gateway(path, env=env)
        try:
            yield gateway, upstream, path
        finally:
            gateway.stop()
    finally:
        upstream.stop()


@contextmanager
def serving(workdir: Path, doc: Callable[[Proc], dict[str, Any]], *,
            env: dict[str, str] | None = None) -> Iterator[tuple[Proc, Proc, Path]]:
    """A mock upstream and a gateway serving ``doc(upstream)`` (its data dir
    ``workdir/data``, demo off, unless ``doc`` says otherwise) from ``workdir/mayu.yaml``:
    (gateway, upstream, config path); both stopped afterwards."""
    def write(upstream: Proc) -> Path:
        config = workdir / "mayu.yaml"
        config.write_text(yaml.safe_dump(
            {"data_dir": str(workdir / "data"), "demo": False, **doc(upstream)}))
        return config

    with upstream_and_gateway(workdir, write, env=env) as served:
        yield served


@contextmanager
def shared_replicas(workdir: Path, config: Callable[[Path, Proc, int], Path],
                    replicas: Iterable[int], *, env: dict[str, str] | None = None
                    ) -> Iterator[tuple[Proc, list[Proc], list[Path]]]:
    """A mock upstream and a gateway for each of ``replicas`` serving ``config(workdir,
    upstream, replica)`` (with ``env``): (upstream, gateways, configs); all stopped
    afterwards."""
    upstream = start_mock_upstream(workdir)
    gateways: list[Proc] = []
    try:
        configs = [config(workdir, upstream, replica) for replica in replicas]
        for path in configs:
            gateways.append(start_gateway(path, env=env))
        yield upstream, gateways, configs
    finally:
        for gateway in gateways:
            gateway.stop()
        upstream.stop()


def wait_none_pending(dsn: str, *, team_id: str | None = None,
                      deadline_s: float = 60.0) -> None:
    """Poll the shared database until no permit (of ``team_id``, or at all) is pending.

    An answer leaves before the store takes its settlement (``server.settle_wait_s`` 0):
    a test reading the database directly after its answers waits here first. Each
    settlement is one transaction (the permit's status with its counters), so once none
    is pending the counters hold every settlement. A hang guard, not a timing assertion.
    """
    query = "SELECT count(*) FROM permits WHERE status = 'pending'"
    params: tuple[str, ...] = ()
    if team_id is not None:
        query, params = query + " AND team_id = %s", (team_id,)
    end = time.monotonic() + deadline_s
    while True:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(query, params).fetchone()
        pending = int(row[0]) if row is not None else 0
        if pending == 0:
            return
        if time.monotonic() > end:
            raise AssertionError(f"{pending} permit(s) still pending after {deadline_s}s")
        time.sleep(0.05)


def replica_config(workdir: Path, replica: int, upstream: Proc, models: list[dict[str, Any]],
                   *, server: dict[str, Any] | None = None, **database: Any) -> Path:
    """``workdir/mayu-<replica>.yaml``: shared-profile replica ``r<replica>`` (its own data
    dir; ``server`` adds settings) serving ``models`` from the ``up`` provider (OpenAI's
    protocol at ``upstream``), the stores of :func:`shared_stores` (``database``)."""
    path = workdir / f"mayu-{replica}.yaml"
    path.write_text(yaml.safe_dump({
        "data_dir": str(workdir / f"data-{replica}"), "demo": False,
        "server": {"replica_id": f"r{replica}", **(server or {})},
        **shared_stores(**database),
        "providers": [{"name": "up", "kind": "openai", "base_url": f"{upstream.url}/v1",
                       "timeout_s": 60}],
        "models": models}))
    return path


def settled_line(data: Path, *, deadline_s: float = 30.0, **fields: Any) -> dict[str, Any]:
    """The last ``settled`` audit line in ``data`` (a gateway's data dir) with ``fields``
    (e.g. ``model=…`` or ``permit=…``), awaited: a line is written after the answer."""
    end = time.monotonic() + deadline_s
    while True:
        found = [rec for path in sorted(data.glob("audit-*.jsonl"))
                 for rec in map(json.loads, path.read_text().splitlines())
                 if rec.get("event") == "settled"
                 and all(rec.get(k) == v for k, v in fields.items())]
        if found:
            return found[-1]
        if time.monotonic() > end:
            raise AssertionError(f"no settled line with {fields} after {deadline_s}s")
        time.sleep(0.05)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(mayu_cmd(*args), capture_output=True, text=True, env=_env(env),
                          timeout=60, check=False)


def create_team(config: Path, name: str, *limits: str,
                env: dict[str, str] | None = None) -> dict[str, Any]:
    """A new team via ``mayu teams create`` (``env``: e.g. a shared store's DSN); its record."""
    done = run_cli("teams", "create", name, "--config", str(config), "--json", *limits,
                   env=env)
    assert done.returncode == 0, done.stderr
    team: dict[str, Any] = json.loads(done.stdout)
    return team


def create_key(config: Path, team: str, *extra: str, env: dict[str, str] | None = None) -> str:
    """A new key for ``team`` via ``mayu keys create``; the plaintext."""
    done = run_cli("keys", "create", "--team", team, "--config", str(config), "--json", *extra,
                   env=env)
    assert done.returncode == 0, done.stderr
    key: str = json.loads(done.stdout)["key"]
    return key


def team_and_key(config: Path, team: str, *limits: str,
                 env: dict[str, str] | None = None) -> tuple[str, str]:
    """A new team (with ``limits``) and a key of it: (team id, key plaintext)."""
    team_id: str = create_team(config, team, *limits, env=env)["id"]
    return team_id, create_key(config, team, env=env)


def shared_stores(**database: Any) -> dict[str, Any]:
    """A shared-profile config's store sections: keys and governance in Postgres, whose DSN
    is ``INFERPLANE_DATABASE_URL``; ``database`` adds pool sizes and the like."""
    return {"key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
            "database": {"dsn_ref": "env:INFERPLANE_DATABASE_URL", **database}}
