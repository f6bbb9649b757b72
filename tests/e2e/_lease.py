"""A lease-profile stack as real processes: inferplaned plus N ``mayu serve`` planes.

Each plane has its own data dir and SQLite stores (keys, counters, permits) and syncs
with inferplaned over ``POST /v1alpha1/sync`` with a data plane token. inferplaned runs
against one migrated Postgres database and can be stopped and restarted on the same
port (the planes' ``control_plane.url`` stays valid). A shared-profile gateway on the
same database (:func:`start_shared`) admits against the same accounts. Used by the
``tests/e2e/test_lease_*.py`` files (:func:`running_stack` is their stack fixture's
body) and ``tests/bench/lease.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from tests.e2e._controlplane import serve_inferplaned, shared_gateway_config
from tests.e2e._procs import (
    ROOT,
    Proc,
    _env,
    create_key,
    free_port,
    run_cli,
    shared_stores,
    start_gateway,
)

WRITER_TOKEN = "e2e-lease-writer-token"
DATAPLANE_TOKEN = "e2e-lease-dataplane-token"
ADMIN_TOKEN = "e2e-lease-admin-token"
PRICE = {"input": 1_000_000, "output": 4_000_000, "cache_read": 100_000,
         "cache_write_5m": 1_250_000, "cache_write_1h": 2_000_000}
MODEL = "gpt-lease"
ENV = {"IPD_TOKEN": WRITER_TOKEN, "MAYU_CP_TOKEN": DATAPLANE_TOKEN,
       "MAYU_ADMIN_TOKEN": ADMIN_TOKEN}


def start_control_plane(workdir: Path, dsn: str, *, port: int) -> Proc:
    config = workdir / "inferplaned.yaml"
    config.write_text(yaml.safe_dump({
        "database": {"dsn_ref": "env:IPD_DSN", "pool_min_size": 1, "pool_max_size": 4},
        "auth": {"writer_tokens_ref": {"e2e": "env:IPD_TOKEN"},
                 "dataplane_tokens_ref": {"nodes": "env:MAYU_CP_TOKEN"}}}))
    return serve_inferplaned(
        config, port=port, log_path=workdir / f"inferplaned-{port}-{time.monotonic_ns()}.log",
        env={"IPD_DSN": dsn, **ENV})


def plane_config(workdir: Path, name: str, *, control_url: str,
                 upstream: Proc | None = None, separate_counters: bool = False,
                 control_plane: dict[str, Any] | None = None,
                 extra: dict[str, Any] | None = None) -> Path:
    """A lease-profile gateway: its own SQLite files, the mock provider (in-process, or
    ``mayu mock-upstream`` over HTTP when ``upstream`` is given); ``control_plane``
    overrides settings of its section (heartbeat, timeout), ``extra`` adds sections."""
    provider: dict[str, Any] = ({"name": "up", "kind": "openai",
                                 "base_url": f"{upstream.url}/v1", "timeout_s": 30}
                                if upstream else {"name": "up", "kind": "mock"})
    deployment: dict[str, Any] = {"provider": "up"}
    if upstream:
        deployment["upstream_model"] = "mock-gpt"
    config: dict[str, Any] = {
        "data_dir": str(workdir / name), "demo": False,
        "server": {"replica_id": name, "max_output_tokens": 100_000,
                   "admin_token_ref": "env:MAYU_ADMIN_TOKEN"},
        "control_plane": {"url": control_url, "token_ref": "env:MAYU_CP_TOKEN",
                          "dataplane_id": name, "max_heartbeat_interval_s": 0.5,
                          "timeout_s": 2.0, **(control_plane or {})},
        "providers": [provider],
        # No tool-use overhead in the bound: the tests' requests carry none, and a tight
        # bound makes a small budget last many requests.
        "models": [{"name": MODEL, "price": PRICE, "deployments": [deployment],
                    "input_overhead_tokens": 0}], **(extra or {})}
    if separate_counters:  # counters and permits apart from the keys: wipeable alone
        config["governance_store"] = {"path": str(workdir / name / "counters.db")}
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def budget_doc(name: str, team: str, *, limit_milli: int, grant_milli: int | None = None,
               renew: str = "1s", failure: str = "FailClosed",
               window: str = "day") -> dict[str, Any]:
    budget: dict[str, Any] = {"limitMilliUSD": limit_milli, "window": window,
                              "hardCap": True}
    if grant_milli is not None:
        budget["lease"] = {"grant": grant_milli, "renewInterval": renew}
    return {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
            "metadata": {"name": name},
            "spec": {"rules": [{"name": "spend", "failurePolicy": failure,
                                "subject": {"kind": "team", "team": team},
                                "budget": budget}]}}


def chat(url: str, key: str, *, max_tokens: int = 50,
         client: httpx.Client | None = None) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hello there"}]}
    post = client.post if client is not None else httpx.post
    return post(f"{url}/v1/chat/completions", json=body,
                headers={"Authorization": f"Bearer {key}"}, timeout=30)


def chat_status(url: str, key: str, client: httpx.Client) -> int:
    """The status of one chat call (callers assert on the status alone, so a failure's
    message never prints the key or credential)."""
    return client.post(f"{url}/v1/chat/completions", timeout=30,
                       headers={"Authorization": f"Bearer {key}"},
                       json={"model": MODEL, "max_tokens": 8,
                             "messages": [{"role": "user", "content": "hi"}]}).status_code


def first_status(stack: LeaseStack, planes: Sequence[str], key: str, *, want: int,
                 meanwhile: Collection[int], since: float, deadline_s: float
                 ) -> dict[str, float]:
    """Request with ``key`` on each of ``planes`` at once (a thread each) until its first
    ``want`` status, any status before it being one of ``meanwhile``: each plane's delay
    after ``since`` (none for a plane still without ``want`` after ``deadline_s``)."""
    delays: dict[str, float] = {}

    def first(name: str) -> None:
        url = stack.planes[name].url
        with httpx.Client() as client:
            end = time.monotonic() + deadline_s
            while time.monotonic() < end:
                status = chat_status(url, key, client)
                if status == want:
                    delays[name] = time.monotonic() - since
                    return
                assert status in meanwhile, (name, status)
                time.sleep(0.02)

    with ThreadPoolExecutor(max_workers=len(planes)) as pool:
        list(pool.map(first, planes))
    return delays


def refused_within_heartbeats(stack: LeaseStack, planes: Sequence[str], key: str, *,
                              meanwhile: Collection[int], revoked: float,
                              heartbeat_s: float, answer_s: float) -> None:
    """Each of ``planes`` refuses ``key``, revoked at inferplaned (its answer came at
    ``revoked``, just now), from the first heartbeat answer after the revoke
    (:func:`first_status` 401; ``meanwhile``: the statuses allowed before it). Counted at
    inferplaned: at most two heartbeats of a plane land between the revoke's answer and
    just after its first 401 (the one in flight at the revoke, whose answer may predate
    it, and the next, which carries the deny list). Timed: each plane's delay is printed
    and stays within one interval plus those two round trips
    (``heartbeat_s + 2 * answer_s``)."""
    beats = {n: p["heartbeats"] for n, p in stack.dataplanes().items()}
    bound = heartbeat_s + 2 * answer_s
    delays = first_status(stack, planes, key, want=401, meanwhile=meanwhile, since=revoked,
                          deadline_s=bound + 20)
    after = {n: p["heartbeats"] - beats[n] for n, p in stack.dataplanes().items()
             if n in planes}
    print(f"\nrevoke -> first 401 (heartbeat {heartbeat_s}s): "
          + ", ".join(f"{n} {delays.get(n, float('nan')):.3f}s" for n in planes)
          + f"; heartbeats meanwhile {after}")
    assert set(delays) == set(planes), f"still admitted after {bound + 20}s: {delays}"
    assert all(after[n] <= 2 for n in planes), after
    assert all(d < bound for d in delays.values()), (bound, delays)


def wait_until(check: Callable[[], bool], *, what: str, deadline_s: float = 60.0) -> None:
    """Poll ``check`` until it holds; a hang guard, not a timing assertion."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened within {deadline_s}s: {what}")


@dataclass
class LeaseStack:
    workdir: Path
    dsn: str
    port: int = field(default_factory=free_port)
    control: Proc | None = None
    planes: dict[str, Proc] = field(default_factory=dict)
    configs: dict[str, Path] = field(default_factory=dict)
    keys: dict[tuple[str, str], str] = field(default_factory=dict)

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start_control(self) -> None:
        self.control = start_control_plane(self.workdir, self.dsn, port=self.port)

    def stop_control(self) -> None:
        if self.control is not None:
            self.control.stop()
            self.control = None

    def add_plane(self, name: str, *, teams: list[str], upstream: Proc | None = None,
                  separate_counters: bool = False, start: bool = True,
                  control_url: str | None = None, control_plane: dict[str, Any] | None = None,
                  extra: dict[str, Any] | None = None) -> Proc | None:
        """Configure a plane (:func:`plane_config`), create its teams and one key each,
        start it."""
        config = plane_config(self.workdir, name, control_url=control_url or self.control_url,
                              upstream=upstream, separate_counters=separate_counters,
                              control_plane=control_plane, extra=extra)
        self.configs[name] = config
        for team in teams:
            self.keys[(name, team)] = self.create_key(name, team)
        return self.start_plane(name) if start else None

    def create_key(self, name: str, team: str) -> str:
        config = self.configs[name]
        run_cli("teams", "create", team, "--config", str(config), env=ENV)
        done = run_cli("keys", "create", "--team", team, "--config", str(config), "--json",
                       env=ENV)
        assert done.returncode == 0, done.stderr
        key: str = json.loads(done.stdout)["key"]
        return key

    def postgres_team(self, team: str) -> None:
        """``team`` in Postgres too, through a shared gateway's CLI (no gateway of it
        runs)."""
        shared = shared_gateway_config(self.workdir, "postgres-cli")
        done = run_cli("teams", "create", team, "--config", str(shared),
                       env={"INFERPLANE_DATABASE_URL": self.dsn})
        assert done.returncode == 0, done.stderr

    def start_plane(self, name: str) -> Proc:
        proc = start_gateway(self.configs[name], env=ENV)
        self.planes[name] = proc
        return proc

    def stop_plane(self, name: str) -> None:
        self.planes.pop(name).stop()

    def stop(self) -> None:
        for proc in self.planes.values():
            proc.stop()
        self.planes.clear()
        self.stop_control()

    def publish(self, doc: dict[str, Any]) -> None:
        name = doc["metadata"]["name"]
        r = httpx.put(f"{self.control_url}/v1alpha1/policies/{name}", json=doc,
                      headers={"Authorization": f"Bearer {WRITER_TOKEN}"}, timeout=30)
        assert r.status_code == 200, r.text

    def dataplanes(self) -> dict[str, dict[str, Any]]:
        r = httpx.get(f"{self.control_url}/v1alpha1/dataplanes",
                      headers={"Authorization": f"Bearer {WRITER_TOKEN}"}, timeout=30)
        r.raise_for_status()
        return {p["id"]: p for p in r.json()["dataplanes"]}

    def lease_row(self, plane: str, rule_uid: str) -> dict[str, Any] | None:
        view = self.dataplanes().get(plane)
        rows = [x for x in (view or {}).get("leases", []) if x["rule_uid"] == rule_uid]
        return rows[0] if rows else None

    def applied_generation(self, plane: str) -> int | None:
        view = self.dataplanes().get(plane)
        return None if view is None else view.get("applied_generation")

    def team_usage(self, plane: str, team: str) -> dict[str, Any]:
        """The plane's own ``/v1/usage`` team row for today (admin token)."""
        proc = self.planes[plane]
        r = httpx.get(f"{proc.url}/v1/usage", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                      timeout=30)
        r.raise_for_status()
        key = self.keys[(plane, team)]
        team_id = _team_id(self.configs[plane], key)
        rows = [row for row in r.json()["data"]
                if row["scope"] == "team" and row["window"] == "day" and row["id"] == team_id]
        return rows[0] if rows else {"usd_committed": 0, "usd_reserved": 0, "requests": 0}

    def largest_bound(self, plane: str) -> int:
        """The largest µUSD bound a permit of this plane was admitted with."""
        import sqlite3

        config = yaml.safe_load(self.configs[plane].read_text())
        path = config.get("governance_store", {}).get("path") or (
            f"{config['data_dir']}/mayu.db")
        with sqlite3.connect(path) as conn:
            row = conn.execute("SELECT max(usd_bound) FROM gov_permits").fetchone()
        return int(row[0] or 0)

    def account(self, rule_uid: str) -> dict[str, Any]:
        """The ``authority_accounts`` rows of a rule, summed (all scopes, current day)."""
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(committed), 0), coalesce(sum(liability), 0),"
                " coalesce(sum(reserved), 0), coalesce(sum(leased_outstanding), 0),"
                " max(\"limit\") FROM authority_accounts WHERE rule_uid = %s",
                (rule_uid,)).fetchone()
        assert row is not None
        return dict(zip(("committed", "liability", "reserved", "leased", "limit"), row,
                        strict=True))


@contextmanager
def running_stack(workdir: Path, dsn: str) -> Iterator[LeaseStack]:
    """inferplaned started on ``dsn``; every process of the stack stopped afterwards."""
    stack = LeaseStack(workdir=workdir, dsn=dsn)
    try:
        stack.start_control()
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def lease_stack(tmp_path: Path, pg_dsn: str) -> Iterator[LeaseStack]:
    """:func:`running_stack` for one test on its fresh database (a module takes it as
    ``stack = lease_stack``)."""
    with running_stack(tmp_path, pg_dsn) as stack:
        yield stack


def upstream_spend(upstream: Proc) -> int:
    """µUSD the mock upstream really served (its own ledger), priced with :data:`PRICE`."""
    from gateway.pricing import ModelPrice, Usage, cost_micro_usd

    entries: list[dict[str, Any]] = httpx.get(f"{upstream.url}/__mock/ledger",
                                              timeout=30).json()
    return sum(cost_micro_usd(Usage(**e["classes"]), ModelPrice(**PRICE)) for e in entries)


def start_shared(workdir: Path, dsn: str, *, upstream: Proc, name: str = "shared"
                 ) -> tuple[Proc, Path]:
    """A shared-profile gateway (keys and admission in Postgres) with the planes' model,
    price and provider (``upstream``), so its requests have the planes' bound."""
    config = workdir / f"{name}.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(workdir / name), "demo": False,
        **shared_stores(pool_min_size=1, pool_max_size=8, policy_refresh_s=1.0),
        "server": {"replica_id": name, "max_output_tokens": 100_000},
        "providers": [{"name": "up", "kind": "openai", "base_url": f"{upstream.url}/v1",
                       "timeout_s": 30}],
        "models": [{"name": MODEL, "price": PRICE, "input_overhead_tokens": 0,
                    "deployments": [{"provider": "up", "upstream_model": "mock-gpt"}]}]}))
    return start_gateway(config, env={"INFERPLANE_DATABASE_URL": dsn}), config


def shared_key(config: Path, dsn: str, team: str) -> str:
    """A key of ``team`` (created if missing) in a shared gateway's Postgres key store."""
    env = {"INFERPLANE_DATABASE_URL": dsn}
    run_cli("teams", "create", team, "--config", str(config), env=env)
    return create_key(config, team, env=env)


def race(targets: list[tuple[str, str]], *, workers: int, max_tokens: int = 50,
         max_attempts: int = 2_000) -> dict[int, int]:
    """``workers`` concurrent clients per (url, key) until each is refused 402 ten times
    in a row, 0.1 s apart (the budget is spent: a 402 while other requests are in flight
    only means their reservations fill it); returns the statuses seen."""
    seen: dict[int, int] = {}
    lock = threading.Lock()

    def work(url: str, key: str) -> None:
        refused = 0
        with httpx.Client() as client:
            for _ in range(max_attempts):
                status = chat(url, key, client=client, max_tokens=max_tokens).status_code
                with lock:
                    seen[status] = seen.get(status, 0) + 1
                refused = refused + 1 if status == 402 else 0
                if refused >= 10:
                    return
                if status == 402:
                    time.sleep(0.1)

    threads = [threading.Thread(target=work, args=t) for t in targets
               for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return seen


def start_drop_proxy(workdir: Path, target_port: int) -> tuple[subprocess.Popen[bytes], int,
                                                                Path]:
    """A :mod:`tests.e2e._tcpproxy` losing an answer on request (``--drop-flag``) in front
    of ``target_port``: (process, port, flag)."""
    port, flag = free_port(), workdir / "drop-next-answer"
    popen = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e._tcpproxy", str(port), "127.0.0.1",
         str(target_port), "--drop-flag", str(flag)],
        stdout=subprocess.PIPE, cwd=str(ROOT), env=_env())
    assert popen.stdout is not None and popen.stdout.readline().strip() == b"ready"
    return popen, port, flag


def _team_id(config: Path, key: str) -> str:
    from gateway.keys import hash_key

    data_dir = yaml.safe_load(config.read_text())["data_dir"]
    import sqlite3

    with sqlite3.connect(f"{data_dir}/mayu.db") as conn:
        row = conn.execute("SELECT team_id FROM keys WHERE key_hash = ?",
                           (hash_key(key),)).fetchone()
    return str(row[0])
