"""``mayu serve`` with ``server.workers: 2`` (local profile): two processes, one SQLite
file, one budget.

Real processes: the gateway's supervisor and its two spawned workers in front of ``mayu
mock-upstream``. The mock's own ledger says what each admitted request cost; the SQLite
file says what was admitted and settled; the supervisor's log says which worker has
which pid, so a test can kill one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import psycopg
import pytest
import yaml

from tests.e2e._load import load_watching_usage, local_permits, one_chat
from tests.e2e._procs import (
    Proc,
    create_key,
    create_team,
    free_port,
    run_cli,
    shared_stores,
    start,
    team_and_key,
    upstream_proc,
    wait_none_pending,
    wait_ready,
)
from tests.e2e.conftest import ADMIN_TOKEN, expected_cost, gateway_config

pytestmark = pytest.mark.e2e

LIMIT = 8_000  # µUSD per day: a few dozen of these requests fit, not all
CLIENTS, EACH = 40, 6
N = CLIENTS * EACH


def _config(tmp_path: Path, upstream: Proc, workers: int) -> Path:
    path = gateway_config(tmp_path, upstream)
    config = yaml.safe_load(path.read_text())
    config["server"].update(workers=workers, replica_id="gw")
    path.write_text(yaml.safe_dump(config))
    return path


def _serve(config: Path, name: str) -> Proc:
    port = free_port()
    return wait_ready(start(["serve", "--config", str(config), "--port", str(port),
                             "--log-level", "info"], port=port,
                            log_path=config.parent / f"{name}.log",
                            env={"MAYU_E2E_ADMIN_TOKEN": ADMIN_TOKEN}))


def _worker_pids(gw: Proc, count: int, *, after: int = 0) -> dict[int, int]:
    """{worker index: pid} from the supervisor's "worker i (pid p) serving" lines (the
    last ``count`` distinct workers announced after the first ``after`` lines)."""
    end = time.monotonic() + 60
    while True:
        found = re.findall(r"worker (\d+) \(pid (\d+)\) serving", gw.logs())[after:]
        pids = {int(i): int(p) for i, p in found}
        if len(pids) >= count:
            return pids
        assert time.monotonic() < end, gw.logs()[-3000:]
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too (reaped by its parent later).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _kill_supervisor(gw: Proc, pids: dict[int, int]) -> None:
    """SIGKILL the supervisor alone, then wait (a hang guard) until its workers ``pids``
    have exited (the kernel sends them SIGTERM: PR_SET_PDEATHSIG)."""
    os.kill(gw.popen.pid, signal.SIGKILL)
    gw.popen.wait(10)
    end = time.monotonic() + 60
    while any(_alive(pid) for pid in pids.values()):
        assert time.monotonic() < end, f"workers {pids} still running"
        time.sleep(0.1)


upstream = upstream_proc  # the fixture, under this module's name


async def _read_stream(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    """Read one streamed answer to its end, or until a killed gateway breaks it."""
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            async for _ in r.aiter_bytes():
                pass
    except httpx.HTTPError:
        pass


def test_two_workers_hold_one_budget_exactly(tmp_path: Path, upstream: Proc) -> None:
    """40 clients x 6 calls (a third streamed) through two workers on one small day
    budget, /v1/usage polled all along: both workers serve, committed + reserved +
    liability never exceeds the limit at any observation, every refusal is a 402, every
    admitted request has one permit settled once at what the upstream's ledger says,
    /metrics (any worker's) counts every request of both, and SIGTERM stops all three
    processes with status 0."""
    config = _config(tmp_path, upstream, workers=2)
    gw = _serve(config, "gateway")
    try:
        pids = _worker_pids(gw, 2)
        create_team(config, "w", "--usd-micros-per-day", str(LIMIT))
        key = create_key(config, "w")
        results, observed = load_watching_usage(gw.url, key, one_chat, clients=CLIENTS,
                                                each=EACH)
        admitted = [r for r in results if r["status"] == 200]
        refused = [r for r in results if r["status"] != 200]
        assert admitted and refused, "the limit should admit some and refuse others"
        for r in refused:
            assert r["status"] == 402 and '"insufficient_quota"' in r["body"], r
        assert observed and max(observed) <= LIMIT

        ledger = {e["id"]: e for e in httpx.get(f"{upstream.url}/__mock/ledger").json()}
        assert sorted(r["mock"] for r in admitted) == sorted(ledger)
        permits = local_permits(config.parent / "data" / "mayu.db", "w", len(admitted))
        assert len(permits) == len(admitted)
        for r in admitted:
            row, entry = permits[r["permit"]], ledger[r["mock"]]
            assert (row["status"], row["kind"], row["settlements"]) == (
                "settled", "complete", 1), row
            assert row["usd_committed"] == expected_cost(entry)
            assert row["tokens_committed"] == sum(entry["classes"].values())
        assert sum(row["usd_committed"] for row in permits.values()) <= LIMIT

        # Both workers served: each admitted permit is in exactly one worker's audit file.
        by_worker = [{line["permit"] for line in map(json.loads, (
            config.parent / "data" / f"audit-gw-{i}.jsonl").read_text().splitlines())
            if line.get("event") == "admitted"} for i in (0, 1)]
        assert by_worker[0] and by_worker[1] and not by_worker[0] & by_worker[1]
        assert by_worker[0] | by_worker[1] == {r["permit"] for r in admitted}
        # /metrics is the sum over the workers, whichever answers the scrape.
        for _ in range(4):
            text = httpx.get(f"{gw.url}/metrics").text
            served = sum(float(v) for v in re.findall(
                r'^mayu_requests_total\{route="/v1/chat/completions",status="\d+"\} (\S+)$',
                text, re.M))
            assert served == N
    finally:
        gw.stop()
    assert gw.popen.returncode == 0, gw.logs()[-3000:]
    assert not any(_alive(pid) for pid in pids.values())
    assert gw.logs().count("admissions and settlements in") == 2  # each worker closed


def test_a_killed_worker_is_restarted_and_what_it_left_open_resolved(
        tmp_path: Path, upstream: Proc) -> None:
    """SIGKILL one worker while it relays streams: the supervisor restarts it, the new
    process resolves the permits the dead one left open from its journal (dispatched,
    no outcome: uncertain, the bound as liability), and the gateway keeps serving."""
    config = _config(tmp_path, upstream, workers=2)
    gw = _serve(config, "gateway")
    try:
        pids = _worker_pids(gw, 2)
        create_team(config, "k")
        key = create_key(config, "k")
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": "gpt-slow", "max_tokens": 64, "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "slow"}]}
        data = config.parent / "data"

        def journal(index: int) -> str:
            path = data / f"journal-gw-{index}.jsonl"
            return path.read_text() if path.exists() else ""

        def dispatched() -> int:
            return sum(journal(i).count('"t":"dispatch"') for i in (0, 1))

        def open_in(index: int) -> int:
            text = journal(index)
            return text.count('"t":"dispatch"') - text.count('"t":"outcome"')

        async def streams() -> int:
            async with httpx.AsyncClient(base_url=gw.url, timeout=60, headers=headers,
                                         limits=httpx.Limits(max_connections=8)) as c:
                tasks = [asyncio.ensure_future(_read_stream(c, body)) for _ in range(8)]
                # Kill only once all eight are dispatched: a request the victim had not
                # yet admitted dies with no permit at all, and the count below is exact.
                end = time.monotonic() + 30
                while dispatched() < 8 and time.monotonic() < end:
                    await asyncio.sleep(0.05)
                # The kernel hands each connection to one worker: kill one relaying some.
                victim = max((0, 1), key=open_in)
                assert open_in(victim), "no stream was dispatched"
                os.kill(pids[victim], signal.SIGKILL)
                await asyncio.gather(*tasks)
                return victim

        victim = asyncio.run(streams())
        restarted = _worker_pids(gw, 1, after=2)
        assert restarted.keys() == {victim} and restarted[victim] != pids[victim]
        assert (f"worker {victim} (pid {pids[victim]}) exited with status -9; restarting it"
                in gw.logs())
        permits = local_permits(data / "mayu.db", "k", 8)
        kinds = sorted(str(p["kind"]) for p in permits.values())
        assert len(permits) == 8 and all(p["status"] != "pending" for p in permits.values())
        assert "uncertain" in kinds, kinds
        for p in permits.values():
            if p["kind"] == "uncertain":
                assert p["usd_liability"] > 0 and p["usd_committed"] == 0, p
        ok = httpx.post(f"{gw.url}/v1/chat/completions", headers=headers, timeout=30, json={
            "model": "gpt-up", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]})
        assert ok.status_code == 200
        assert _alive(pids[1 - victim])  # the other worker was never touched
    finally:
        gw.stop()
    assert gw.popen.returncode == 0


def test_journals_no_worker_owns_are_resolved_by_the_next_run(
        tmp_path: Path, upstream: Proc) -> None:
    """Kill a two-worker gateway outright (supervisor and workers) while streams run,
    then start it with one process: it resolves both workers' journals (their permits
    settle uncertain), and back at two workers it resolves the single process's."""
    config = _config(tmp_path, upstream, workers=2)
    gw = _serve(config, "first")
    pids = _worker_pids(gw, 2)
    create_team(config, "o")
    key = create_key(config, "o")
    body = {"model": "gpt-slow", "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": "slow"}]}
    data = config.parent / "data"

    async def streams(url: str, count: int, kill: list[int], journals: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60,
                                     headers={"Authorization": f"Bearer {key}"}) as c:
            tasks = [asyncio.ensure_future(_read_stream(c, body)) for _ in range(count)]
            end = time.monotonic() + 30
            while time.monotonic() < end and sum(
                    p.read_text().count('"t":"dispatch"')
                    for p in data.glob(journals)) < count:
                await asyncio.sleep(0.05)
            for pid in kill:
                os.kill(pid, signal.SIGKILL)
            await asyncio.gather(*tasks)

    try:
        asyncio.run(streams(gw.url, 6, [gw.popen.pid, *pids.values()], "journal-gw-*.jsonl"))
    finally:
        gw.stop()
    left = {p.name: p.read_text().count('"t":"dispatch"')
            for p in data.glob("journal-gw-*.jsonl")}
    assert sum(left.values()) == 6, left

    single = _config(tmp_path, upstream, workers=1)
    gw = _serve(single, "second")
    try:
        permits = local_permits(data / "mayu.db", "o", 6)
        assert sorted(p["kind"] for p in permits.values()) == ["uncertain"] * 6
        # One more stream left open in the single process's journal, then two workers.
        asyncio.run(streams(gw.url, 1, [gw.popen.pid], "journal-gw.jsonl"))
    finally:
        gw.stop()
    gw = _serve(_config(tmp_path, upstream, workers=2), "third")
    try:
        permits = local_permits(data / "mayu.db", "o", 7)
        assert len(permits) == 7
        assert sorted(p["kind"] for p in permits.values()) == ["uncertain"] * 7
    finally:
        gw.stop()


def test_shared_profile_workers_hold_a_hot_budget(tmp_path: Path, upstream: Proc,
                                                  pg_dsn: str) -> None:
    """Shared profile: a two-worker gateway and a single one on one database, 240 calls
    on one team's day budget: every answer 200 or 402, committed never above the budget
    and equal to the cost of the upstream's ledger once settled, nothing reserved; both
    workers answered and audited."""
    dsn = pg_dsn
    env = {"INFERPLANE_DATABASE_URL": dsn, "MAYU_E2E_ADMIN_TOKEN": ADMIN_TOKEN}
    procs: list[Proc] = []
    try:
        configs = []
        for replica, workers in (("gwa", 2), ("gwb", 1)):
            (tmp_path / replica).mkdir()
            path = gateway_config(tmp_path / replica, upstream)
            config = yaml.safe_load(path.read_text())
            config["server"].update(workers=workers, replica_id=replica)
            config.update(shared_stores(pool_min_size=1, pool_max_size=4))
            path.write_text(yaml.safe_dump(config))
            configs.append(path)
            port = free_port()
            procs.append(wait_ready(start(["serve", "--config", str(path), "--port",
                                           str(port), "--log-level", "info"], port=port,
                                          log_path=path.parent / "gateway.log", env=env)))
        _worker_pids(procs[0], 2)
        team_id, key = team_and_key(configs[0], "hot", "--usd-micros-per-day", str(LIMIT),
                                    env=env)

        async def run() -> list[dict[str, Any]]:
            clients = [httpx.AsyncClient(base_url=p.url, timeout=120,
                                         headers={"Authorization": f"Bearer {key}"},
                                         limits=httpx.Limits(max_connections=N))
                       for p in procs]
            try:
                # Two thirds of the calls to the two-worker gateway.
                return await asyncio.gather(*(one_chat(clients[min(i % 3, 1)], i)
                                              for i in range(N)))
            finally:
                for c in clients:
                    await c.aclose()

        results = asyncio.run(run())
        assert {r["status"] for r in results} == {200, 402}
        admitted = [r for r in results if r["status"] == 200]
        wait_none_pending(dsn, team_id=team_id)
        with psycopg.connect(dsn) as conn:
            [(committed, reserved)] = conn.execute(
                "SELECT coalesce(sum(committed), 0), coalesce(sum(reserved), 0) FROM counters"
                " WHERE key LIKE %s", (f"team:{team_id}:usd:day:%",)).fetchall()
        ledger = httpx.get(f"{upstream.url}/__mock/ledger").json()
        assert len(ledger) == len(admitted)
        assert reserved == 0
        assert committed == sum(expected_cost(e) for e in ledger) <= LIMIT
        for i in (0, 1):  # each worker answered some (admitted or refused) and audited it
            audit = configs[0].parent / "data" / f"audit-gwa-{i}.jsonl"
            assert '"request_id":"req_' in audit.read_text(), audit
    finally:
        for proc in procs:
            proc.stop()
    assert procs[0].popen.returncode == 0  # the supervisor, once its workers drained


def test_bad_worker_counts_and_a_busy_port_are_named(tmp_path: Path) -> None:
    """--workers out of range, a lease config with workers and a port in use: each a
    one-line error naming what to fix, no traceback, no worker started."""
    done = run_cli("serve", "--workers", "0")
    assert done.returncode == 2 and "argument --workers: 0 is not a number of workers (1-64)" \
        in done.stderr
    lease = tmp_path / "lease.yaml"
    lease.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "d"),
                                     "control_plane": {"url": "http://127.0.0.1:1"}}))
    done = run_cli("serve", "--config", str(lease), "--workers", "2")
    assert done.returncode != 0 and "--workers: the lease profile runs one process per node" \
        in done.stderr and "Traceback" not in done.stderr
    config = tmp_path / "mayu.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "demo": False,
                                      "server": {"workers": 2}}))
    # Held plainly, or with SO_REUSEPORT as another mayu serve's workers hold theirs (whose
    # group would otherwise take this one's workers in, silently sharing the port).
    for reuse_port in (False, True):
        with socket.socket() as busy:
            if reuse_port:
                busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            done = run_cli("serve", "--config", str(config), "--port", str(port))
        assert done.returncode == 2, done.stderr
        assert f"mayu: error: server.port: cannot listen on 127.0.0.1:{port}: Address " \
            "already in use" in done.stderr
        assert "Traceback" not in done.stderr


def test_workers_stop_when_the_supervisor_is_killed(tmp_path: Path, upstream: Proc) -> None:
    """SIGKILL the supervisor alone: the kernel sends each worker SIGTERM
    (PR_SET_PDEATHSIG), they drain and exit, and nothing listens on the port any more."""
    gw = _serve(_config(tmp_path, upstream, workers=2), "gateway")
    try:
        pids = _worker_pids(gw, 2)
        _kill_supervisor(gw, pids)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{gw.url}/readyz", timeout=5)
    finally:
        gw.stop()
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _mock_id(answer_id: str) -> int:
    """The mock's ledger id in an answer's id (``chatcmpl-mock-7``, ``msg_mock_7``)."""
    return int(re.split(r"[-_]", answer_id)[-1])


def test_sdks_through_two_workers_get_their_costs(tmp_path: Path, upstream: Proc) -> None:
    """The openai and anthropic SDKs, streamed and not, several calls each through a
    two-worker gateway: every answer's cost header is the price of the upstream's own
    ledger entry for it, and /v1/usage (whichever worker answers) totals the ledger."""
    config = _config(tmp_path, upstream, workers=2)
    gw = _serve(config, "gateway")
    try:
        create_team(config, "sdk")
        key = create_key(config, "sdk")
        oai = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
        ant = anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)
        costs: dict[int, int] = {}  # mock id -> cost header
        for i in range(6):
            raw = oai.chat.completions.with_raw_response.create(
                model="gpt-up", max_tokens=12, messages=[{"role": "user", "content": f"hi {i}"}])
            costs[_mock_id(raw.parse().id)] = int(raw.headers["x-inferplane-cost-micro-usd"])
            message = ant.messages.with_raw_response.create(
                model="claude-up", max_tokens=12, messages=[{"role": "user", "content": f"yo {i}"}])
            costs[_mock_id(message.parse().id)] = int(
                message.headers["x-inferplane-cost-micro-usd"])
            text = "".join(c.choices[0].delta.content or "" for c in oai.chat.completions.create(
                model="gpt-up", max_tokens=12, stream=True,
                messages=[{"role": "user", "content": f"stream {i}"}]) if c.choices)
            assert text
            with ant.messages.stream(model="claude-up", max_tokens=12,
                                     messages=[{"role": "user", "content": f"s {i}"}]) as s:
                final = s.get_final_message()
            assert final.usage.output_tokens > 0
        ledger = httpx.get(f"{upstream.url}/__mock/ledger").json()
        assert len(ledger) == 24
        by_id = {e["id"]: e for e in ledger}
        for mock_id, cost in costs.items():
            assert cost == expected_cost(by_id[mock_id])
        total = sum(expected_cost(e) for e in ledger)
        end = time.monotonic() + 30
        while True:  # the last settlements are taken while their answers leave
            rows = httpx.get(f"{gw.url}/v1/usage",
                             headers={"Authorization": f"Bearer {key}"}).json()["data"]
            day = next(r for r in rows if (r["scope"], r["window"]) == ("team", "day"))
            if day["usd_reserved"] == 0 or time.monotonic() > end:
                break
            time.sleep(0.05)
        assert (day["usd_committed"], day["usd_reserved"]) == (total, 0)
    finally:
        gw.stop()


def test_budget_gauge_sums_to_the_days_figure_after_a_restart(tmp_path: Path,
                                                              upstream: Proc) -> None:
    """Spend part of a team's day budget through two workers, restart them: the budget
    utilisation gauge (summed over the workers by /metrics) is again the day's committed
    over its limit, as /v1/usage says, once both workers have admitted for the team."""
    limit = 1_000_000
    config = _config(tmp_path, upstream, workers=2)
    gw = _serve(config, "first")
    try:
        create_team(config, "gauge", "--usd-micros-per-day", str(limit))
        key = create_key(config, "gauge")
        team_id = json.loads(run_cli("teams", "list", "--config", str(config), "--json")
                             .stdout)
        headers = {"Authorization": f"Bearer {key}"}
        body = {"model": "gpt-up", "max_tokens": 8,
                "messages": [{"role": "user", "content": "spend"}]}
        for _ in range(10):
            assert httpx.post(f"{gw.url}/v1/chat/completions", json=body,
                              headers=headers, timeout=30).status_code == 200
    finally:
        gw.stop()
    data = config.parent / "data"
    seen = [(data / f"audit-gw-{i}.jsonl").stat().st_size for i in (0, 1)]
    gw = _serve(config, "second")
    try:
        # New connections until each worker has admitted a request for the team.
        for _ in range(200):
            if all('"event":"admitted"' in (data / f"audit-gw-{i}.jsonl").read_text()[
                    seen[i]:] for i in (0, 1)):
                break
            assert httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers,
                              timeout=30).status_code == 200
        else:
            raise AssertionError("200 new connections never reached both workers")
        end = time.monotonic() + 30
        while True:
            rows = httpx.get(f"{gw.url}/v1/usage", headers=headers).json()["data"]
            day = next(r for r in rows if (r["scope"], r["window"]) == ("team", "day"))
            if day["usd_reserved"] == 0 or time.monotonic() > end:
                break
            time.sleep(0.05)
        expected = (day["usd_committed"] + day["usd_liability"]) / limit
        team = next(t for t in team_id if t["name"] == "gauge")["id"]
        pseudonym = hashlib.sha256(team.encode()).hexdigest()[:16]
        pattern = re.compile(r'^mayu_budget_utilisation_ratio\{[^}]*team_id="'
                             + pseudonym + r'"[^}]*\} (\S+)$', re.M)

        def gauge() -> float:
            found = pattern.search(httpx.get(f"{gw.url}/metrics").text)
            assert found, "no budget gauge for the team"
            return float(found.group(1))
        # The settling worker moves its gauge just after the store's commit that
        # /v1/usage already sees (a loaded machine can hold it a few ms): wait for it.
        end = time.monotonic() + 10
        while gauge() != pytest.approx(expected, rel=1e-9) and time.monotonic() < end:
            time.sleep(0.05)
        for _ in range(4):  # whichever worker answers the scrape, the same sum
            assert gauge() == pytest.approx(expected, rel=1e-9)
    finally:
        gw.stop()


def test_a_worker_that_cannot_start_stops_them_all(tmp_path: Path, upstream: Proc) -> None:
    """A second two-worker gateway on the same data dir: its workers find their journals
    locked by the first one's, so it exits 1 naming the journal, with no worker left
    running; the first one keeps serving."""
    config = _config(tmp_path, upstream, workers=2)
    first = _serve(config, "first")
    try:
        port = free_port()
        second = start(["serve", "--config", str(config), "--port", str(port),
                        "--log-level", "info"], port=port,
                       log_path=config.parent / "second.log",
                       env={"MAYU_E2E_ADMIN_TOKEN": ADMIN_TOKEN})
        try:
            assert second.popen.wait(60) == 1, second.logs()[-3000:]
        finally:
            second.stop()
        logs = second.logs()
        assert "is in use by another process; every replica needs its own data dir" in logs
        assert "before it served; stopping all workers" in logs
        spawned = [int(p) for p in re.findall(r"Started server process \[(\d+)\]", logs)]
        assert spawned and not any(_alive(pid) for pid in spawned)
        assert httpx.get(f"{first.url}/readyz", timeout=5).status_code == 200
    finally:
        first.stop()
