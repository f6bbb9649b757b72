"""Operating the gateway (issue 10): audit durability, budget alerts, rolling restarts.

Real processes (``mayu serve``, ``mayu mock-upstream``), real Postgres, real HTTP:

- a replica SIGKILLed under load loses no audit line beyond the documented bound: every
  answer a client received has its ``settled`` line, every permit the store granted has
  its ``admitted`` line (except the window between the store's grant and the line, which
  the journal shares), lines span several rotated files and none is torn but possibly
  the last line of the file being written at the kill;
- a team budget crossing 80/90/100 % under load spread over 3 shared replicas produces
  exactly three signed webhook deliveries;
- a rolling restart (SIGTERM, drain, restart; then the other replica) lets every ~20 s
  stream finish for its client, and leaves no permit pending.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from gateway.audit import rotated_paths
from tests.e2e._procs import (
    Proc,
    create_key,
    create_team,
    run_cli,
    start_gateway,
    start_mock_upstream,
)
from tests.e2e.conftest import PRICE
from tests.webhook import WebhookReceiver

pytestmark = pytest.mark.e2e

KEEP = 1000


def _lines_of(path: str, *, last_may_tear: bool) -> list[dict[str, Any]]:
    """The JSON lines of one audit file; a torn (unterminated or unparseable) last line
    is allowed only where ``last_may_tear``."""
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: empty unless the last write was torn
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            assert last_may_tear and i == len(lines) - 1 and not tail, (path, line[:200])
    assert not tail or last_may_tear, (path, tail[:200])
    return out


@dataclass
class Load:
    """Client threads posting (stream and not) until stopped; what they fully received."""

    url: str
    key: str
    received: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, n: int) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._loop, args=(i,), daemon=True)
                   for i in range(n)]
        for t in threads:
            t.start()
        return threads

    def _loop(self, worker: int) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        i = 0
        with httpx.Client(base_url=self.url, timeout=30, headers=headers) as client:
            while not self.stop.is_set():
                i += 1
                body = {"model": "m", "max_tokens": 16 + i % 9, "stream": i % 2 == 0,
                        "messages": [{"role": "user", "content": f"w{worker} call {i}"}]}
                try:
                    permit = self._one(client, body)
                except httpx.HTTPError:
                    return  # the gateway is gone
                if permit is not None:
                    with self.lock:
                        self.received.append(permit)

    @staticmethod
    def _one(client: httpx.Client, body: dict[str, Any]) -> str | None:
        """The permit of a fully received answer (a stream up to its [DONE])."""
        if not body["stream"]:
            r = client.post("/v1/chat/completions", json=body)
            return r.headers.get("x-inferplane-permit") if r.status_code == 200 else None
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            # Done at [DONE], as an SDK is: the answer counts as received from there on,
            # whether or not the rest of the response (its end) ever arrives.
            for line in r.iter_lines():
                if line.strip() == "data: [DONE]" and r.status_code == 200:
                    return r.headers.get("x-inferplane-permit")
        return None


def _local_config(workdir: Path) -> Path:
    config = workdir / "mayu.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(workdir / "data"), "demo": False,
        "server": {"replica_id": "k1", "audit_max_bytes": 16_384, "audit_keep": KEEP},
        "providers": [{"name": "mock", "kind": "mock", "latency_ms": 2}],
        "models": [{"name": "m", "price": PRICE, "deployments": [
            {"provider": "mock", "upstream_model": "mock-gpt"}]}]}))
    return config


def test_sigkill_under_load_loses_no_audit_line(tmp_path: Path) -> None:
    """kill -9 during load from 4 threads: every answer a client received (a stream up
    to [DONE]) has its settled line; every permit in the store has its admitted line,
    but for permits still pending with no journal record either (granted, killed before
    the line); lines span several rotated files, only the current file's last may tear."""
    config = _local_config(tmp_path)
    create_team(config, "load")
    key = create_key(config, "load")
    gateway = start_gateway(config)
    load = Load(gateway.url, key)
    threads = load.run(4)
    try:
        time.sleep(4)
        os.kill(gateway.popen.pid, signal.SIGKILL)
        gateway.popen.wait(timeout=10)
    finally:
        load.stop.set()
        for t in threads:
            t.join(timeout=30)
        gateway.stop()
    audit = str(tmp_path / "data" / "audit-k1.jsonl")
    files = [p for p in rotated_paths(audit, KEEP) if os.path.exists(p)]
    assert len(files) >= 3, files
    assert not os.path.exists(f"{audit}.{KEEP}")  # nothing was rotated away
    lines = [line for p in reversed(files)
             for line in _lines_of(p, last_may_tear=p == audit)]
    events: dict[str, set[str]] = {}
    for line in lines:
        if line.get("permit"):
            events.setdefault(line["permit"], set()).add(line.get("event", ""))
    assert len(load.received) > 50, len(load.received)
    missing = [p for p in load.received if "settled" not in events.get(p, set())]
    assert missing == []
    with sqlite3.connect(tmp_path / "data" / "mayu.db") as db:
        permits = db.execute("SELECT id, status FROM gov_permits").fetchall()
    journal = (tmp_path / "data" / "journal-k1.jsonl").read_text().splitlines()
    journaled = {json.loads(j)["p"] for j in journal[:-1] if '"t":"admit"' in j}
    unaudited = [(pid, status) for pid, status in permits
                 if "admitted" not in events.get(pid, set())]
    assert all(status == "pending" and pid not in journaled for pid, status in unaudited)
    assert len(unaudited) <= 4  # at most one admission in flight per client thread
    print(f"\n{len(load.received)} answers, {len(permits)} permits, {len(lines)} lines in "
          f"{len(files)} files; {len(unaudited)} granted at the kill without a line")


# -- shared profile ----------------------------------------------------------------------

SECRET = "e2e-alert-secret"


def _shared_config(workdir: Path, name: str, *, server: dict[str, Any],
                   providers: list[dict[str, Any]], models: list[dict[str, Any]]) -> Path:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "data_dir": str(workdir / name), "demo": False,
        "server": {"replica_id": name, **server},
        "key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
        "database": {"dsn_ref": "env:INFERPLANE_DATABASE_URL", "pool_min_size": 1,
                     "pool_max_size": 6},
        "providers": providers, "models": models}))
    return path


def _env(dsn: str) -> dict[str, str]:
    return {"INFERPLANE_DATABASE_URL": dsn, "MAYU_E2E_ALERT_SECRET": SECRET}


def _team_key(config: Path, dsn: str, team: str, *limits: str) -> str:
    for args in (("teams", "create", team, *limits), ("keys", "create", "--team", team)):
        done = run_cli(*args, "--config", str(config), "--json", env=_env(dsn))
        assert done.returncode == 0, done.stderr
    key: str = json.loads(done.stdout)["key"]
    return key


def _sql(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description is not None else []


def _metric_total(gateways: list[Proc], name: str) -> float:
    total = 0.0
    for gw in gateways:
        for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines():
            if line.startswith(name):
                total += float(line.rsplit(" ", 1)[1])
    return total


def _alert_configs(workdir: Path, hook: str) -> list[Path]:
    """3 shared replicas whose in-process mock answers without usage (every permit
    settles uncertain: its whole bound stays as liability), alerting to ``hook``."""
    return [_shared_config(
        workdir, f"a{i}",
        server={"alerts": {"webhook_url": hook, "secret_ref": "env:MAYU_E2E_ALERT_SECRET",
                           "retry_backoff_s": 0.2}},
        providers=[{"name": "mock", "kind": "mock"}],
        models=[{"name": "m", "price": PRICE, "deployments": [
            {"provider": "mock", "upstream_model": "mock-missing-usage"}]}])
        for i in range(3)]


def test_team_budget_alerts_once_per_threshold_across_three_replicas(
        tmp_path: Path, pg_dsn: str) -> None:
    """40 concurrent calls spread over 3 shared replicas on a team day budget of 20
    bounds: 20 are admitted, the budget reaches 80, 90 and 100 %, and the webhook gets
    exactly three deliveries, each signed with the secret; alert_events holds three
    delivered rows, the replicas' mayu_budget_alerts_total sum to 3 and their audit
    files hold three budget_alert lines."""
    gateways: list[Proc] = []
    with WebhookReceiver() as hook:
        configs = _alert_configs(tmp_path, hook.url)
        try:
            for config in configs:
                gateways.append(start_gateway(config, env=_env(pg_dsn)))
            body = {"model": "m", "max_tokens": 200,
                    "messages": [{"role": "user", "content": "spend"}]}
            probe = _team_key(configs[0], pg_dsn, "probe")
            r = httpx.post(f"{gateways[0].url}/v1/chat/completions", json=body, timeout=30,
                           headers={"Authorization": f"Bearer {probe}"})
            bound = int(r.headers["x-inferplane-usd-bound"])
            key = _team_key(configs[0], pg_dsn, "hot", "--usd-micros-per-day",
                            str(20 * bound))
            statuses: list[int] = []

            def call(i: int) -> None:
                r = httpx.post(f"{gateways[i % 3].url}/v1/chat/completions", json=body,
                               timeout=60, headers={"Authorization": f"Bearer {key}"})
                statuses.append(r.status_code)

            threads = [threading.Thread(target=call, args=(i,)) for i in range(40)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(statuses) == [200] * 20 + [402] * 20, statuses
            hook.wait_for(3)
            time.sleep(3)  # a fourth delivery would have arrived by now
            received = hook.received
            alerts_total = _metric_total(gateways, "mayu_budget_alerts_total")
        finally:
            for gw in gateways:
                gw.stop()
    assert sorted(r.json()["threshold"] for r in received) == [80, 90, 100]
    assert all(r.signed_with(SECRET) for r in received)
    assert {r.json()["scope"] for r in received} == {"team"}
    assert max(r.json()["liability"] for r in received) == 20 * bound
    rows = _sql(pg_dsn, "SELECT threshold, replica, delivered_at IS NOT NULL, attempts"
                        " FROM alert_events ORDER BY threshold")
    assert [(t, ok, n) for t, _, ok, n in rows] == [(80, True, 1), (90, True, 1),
                                                    (100, True, 1)]
    assert alerts_total == 3
    audit = [json.loads(line) for c in configs
             for line in (c.parent / c.stem / f"audit-{c.stem}.jsonl").read_text()
             .splitlines()]
    assert sorted(a["threshold"] for a in audit if a.get("event") == "budget_alert") == \
        [80, 90, 100]
    print(f"\nalert events claimed by replicas {[r for _, r, _, _ in rows]}")


def _slow_stream(url: str, key: str, done: dict[str, str], errors: list[str],
                 name: str) -> None:
    """One ~20 s stream; records its permit under ``name`` once [DONE] arrived."""
    body = {"model": "slow", "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": f"a long story {name}"}]}
    try:
        with httpx.Client(timeout=120) as client, client.stream(
                "POST", f"{url}/v1/chat/completions", json=body,
                headers={"Authorization": f"Bearer {key}"}) as r:
            if r.status_code != 200:
                errors.append(f"{name}: HTTP {r.status_code}")
                return
            for line in r.iter_lines():
                if line.strip() == "data: [DONE]":
                    done[name] = r.headers["x-inferplane-permit"]
    except httpx.HTTPError as exc:
        errors.append(f"{name}: {type(exc).__name__}: {exc}")


def test_rolling_restart_lets_every_stream_finish(tmp_path: Path, pg_dsn: str) -> None:
    """Two shared replicas, ~20 s streams on both: SIGTERM one (it drains within
    shutdown_grace_s), restart it, then the other the same way. Every stream ends with
    [DONE] for its client; afterwards no permit is pending and each stream's permit is
    settled complete."""
    upstream = start_mock_upstream(tmp_path, latency_ms=400)
    configs = [_shared_config(
        tmp_path, f"r{i}", server={"shutdown_grace_s": 60},
        providers=[{"name": "up", "kind": "openai", "base_url": f"{upstream.url}/v1",
                    "timeout_s": 120}],
        models=[{"name": "slow", "price": PRICE, "deployments": [
            {"provider": "up", "upstream_model": "mock-slow-stream"}]}]) for i in range(2)]
    gateways: list[Proc] = []
    done: dict[str, str] = {}
    errors: list[str] = []
    timings: list[str] = []
    try:
        gateways += [start_gateway(c, env=_env(pg_dsn)) for c in configs]
        key = _team_key(configs[0], pg_dsn, "rolling")
        threads: list[threading.Thread] = []
        for victim in (0, 1):
            other = 1 - victim
            batch = [threading.Thread(target=_slow_stream, args=(
                gateways[g].url, key, done, errors, f"p{victim}-{g}-{i}"))
                for i, g in enumerate([victim] * 3 + [other])]
            for t in batch:
                t.start()
            threads += batch
            time.sleep(3)  # the streams are under way
            started = time.monotonic()
            gateways[victim].popen.send_signal(signal.SIGTERM)
            code = gateways[victim].popen.wait(timeout=90)
            timings.append(f"replica {victim} drained in {time.monotonic() - started:.1f} s "
                           f"(exit {code})")
            assert code == -signal.SIGTERM  # uvicorn re-raises it after the drain
            gateways[victim] = start_gateway(configs[victim], env=_env(pg_dsn))
        for t in threads:
            t.join(timeout=120)
    finally:
        for gw in gateways:
            gw.stop()
        upstream.stop()
    print("\n" + "; ".join(timings))
    assert errors == []
    assert len(done) == 8, sorted(done)
    assert _sql(pg_dsn, "SELECT count(*) FROM permits WHERE status = 'pending'") == [(0,)]
    statuses = _sql(pg_dsn, "SELECT id::text, status FROM permits")
    assert {pid: status for pid, status in statuses if pid in done.values()} == {
        pid: "complete" for pid in done.values()}


def test_stream_end_marker_follows_its_audit_line(tmp_path: Path, pg_dsn: str) -> None:
    """With settlement slowed to 0.4 s in the database, a stream's [DONE] still reaches
    the client only after its permit's settled line is in the audit file (settled and
    audited before the end marker is relayed)."""
    _sql(pg_dsn, "CREATE FUNCTION e2e_slow() RETURNS trigger LANGUAGE plpgsql AS "
                 "$$ BEGIN IF NEW.status <> 'pending' THEN PERFORM pg_sleep(0.4); END IF;"
                 " RETURN NEW; END $$")
    _sql(pg_dsn, "CREATE TRIGGER e2e_slow BEFORE UPDATE ON permits FOR EACH ROW "
                 "EXECUTE FUNCTION e2e_slow()")
    config = _shared_config(tmp_path, "o0", server={"settle_wait_s": 2},
                            providers=[{"name": "mock", "kind": "mock"}],
                            models=[{"name": "m", "price": PRICE, "deployments": [
                                {"provider": "mock", "upstream_model": "mock-gpt"}]}])
    gateway = start_gateway(config, env=_env(pg_dsn))
    audit = tmp_path / "o0" / "audit-o0.jsonl"
    try:
        key = _team_key(config, pg_dsn, "order")
        body = {"model": "m", "max_tokens": 16, "stream": True,
                "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(3):
            with httpx.Client(timeout=30) as client, client.stream(
                    "POST", f"{gateway.url}/v1/chat/completions", json=body,
                    headers={"Authorization": f"Bearer {key}"}) as r:
                permit = r.headers["x-inferplane-permit"]
                for line in r.iter_lines():
                    if line.strip() == "data: [DONE]":
                        settled = [a for a in map(json.loads, audit.read_text().splitlines())
                                   if a.get("permit") == permit and a["event"] == "settled"]
                        assert len(settled) == 1 and settled[0]["stored"] is True
    finally:
        gateway.stop()

