"""Kills aimed at what the primary is doing: admissions, settlements, a journal replay.

The same setup as ``test_failover_ha.py`` (its module fixture, a cluster of this module's
own: etcd, Patroni, three PostgreSQL members with synchronous replication, three
``mayu serve`` replicas of the shared profile on the multi-host DSN, real OpenAI SDK
clients, a team with a hard µUSD budget that binds, slow streams in flight), but each
crash is aimed, and the test proves it hit: :meth:`tests._ha.Cluster.crash_when` watches
the primary's ``pg_stat_activity`` and kills every process of the member as soon as the
target calls are running, their backends first; the rows it saw are asserted non-empty
and printed.

To make the target calls certainly in flight at the kill, the primary's WAL senders are
stopped (SIGSTOP) just before it: every commit then waits for its synchronous standby
(``wait_event`` ``SyncRep``: written on the primary, not acknowledged), the exact moment
whose answer a crash loses, and the other calls of the team wait behind it for its row
locks. The ``statement_timeout`` does not end that wait (PostgreSQL disarms it before
the commit); the stall lasts until the kill, a few seconds at most.

- during admissions: a burst of requests sent once the stall began; every admission call
  is stuck in its commit when the primary dies. None of those requests may reach the
  upstream, and a permit the new primary holds for one is refunded (the gateway's
  lost-acknowledgement sweep, by request id).
- during settlements: slow streams sent at once end at about the same moment; the kill
  lands while their settlement calls wait in their commits. Every one is replayed from
  the replicas' journals on the new primary and settled once.
- during a replay: a kill during settlements, then two replicas are paused (SIGSTOP)
  with the settlements that failed in their journals, until the new primary has a
  synchronous standby of its own (Patroni promotes only that one); the third replays its
  journal on it first (that replay must survive the second kill); then the new primary's
  WAL senders stop, the paused replicas resume and start their replays, and the new
  primary is killed while their first settlement calls wait in their commits. Their
  replays finish on the third primary; a fresh gateway started on copies of the journals
  as they were before any replay replays them all again and changes nothing (the replay
  is idempotent: the store answers a permit's settlement it already holds as a replay).

After each: Σ committed == the upstream's ledger, nothing reserved, no liability,
committed + liability + reserved never above the limit at any 0.2 s sample, every permit
settled once, the same usage on every replica, every journal empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.governance._journal import scan_journal
from tests._ha import Member, Shot
from tests.e2e import test_failover_ha as base
from tests.e2e._procs import start_gateway
from tests.e2e.test_failover_ha import HA, REPLICAS, WINDOW_BOUND_S, Answer, Load

pytestmark = pytest.mark.e2e

ha = base.ha
"""The module's cluster and gateways (``test_failover_ha.ha``, module-scoped: this
module starts its own)."""

LIMIT = 200_000
"""The team's hard µUSD day budget here: the background load's slow streams and a burst
of BURST slow streams bound ~8,000 µUSD each, more than fits: the limit binds."""
BURST = 24
STALL_DEADLINE_S = 8.0
"""How long a stalled primary is watched for the target calls before the test fails
(nothing killed then; a hang guard: they showed up within 2.2 s on a loaded machine)."""
ADMIT = "inferplane_admit"
"""The admission functions' calls (``inferplane_admit_one_v2``, ``inferplane_admit_v2``)."""
SETTLE = "inferplane_settle"
"""The settlement functions' calls (``inferplane_settle_one_v2``, ``inferplane_settle_v2``)."""


@dataclass
class Burst:
    """``n`` requests sent at once across the replicas; their answers also go to the
    load's (so the module's checks count them)."""

    answers: list[Answer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    first_done: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "the burst never ended"


def _burst(ha: HA, load: Load, n: int, *, model: str, stream: bool) -> Burst:
    burst = Burst()

    async def one(client: openai.AsyncOpenAI, i: int) -> None:
        sent, status, retry = time.monotonic(), 200, None
        messages: Any = [{"role": "user", "content": f"aimed {i}"}]
        try:
            if stream:
                chunks = await client.chat.completions.create(
                    model=model, max_tokens=2_000, stream=True, messages=messages)
                async for _ in chunks:
                    pass
            else:
                await client.chat.completions.create(model=model, max_tokens=16,
                                                     messages=messages)
        except openai.APIStatusError as exc:
            status, retry = exc.status_code, exc.response.headers.get("retry-after")
            burst.errors.append(f"{status} {exc.message}")
        except openai.APIError as exc:  # a broken connection or stream
            status = -1  # the module's checks allow 200, 402 and 503 only
            burst.errors.append(f"{type(exc).__name__}: {exc}")
        answer = Answer(sent=sent, done=time.monotonic(), status=status, retry_after=retry)
        burst.answers.append(answer)
        load.answers.append(answer)
        if status == 200:
            burst.first_done.set()

    async def main() -> None:
        clients = [openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=load.key,
                                      max_retries=0, timeout=90) for gw in ha.gateways]
        try:
            await asyncio.gather(*(one(clients[i % REPLICAS], i) for i in range(n)))
        finally:
            for c in clients:
                await c.close()

    burst.thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    burst.thread.start()
    return burst


@dataclass
class Run:
    """One scenario's team, load and ledger mark."""

    ha: HA
    load: Load
    since: int
    worker: threading.Thread
    limit: int


@pytest.fixture
def run(ha: HA, request: pytest.FixtureRequest) -> Iterator[Run]:
    """A team with a hard µUSD day budget (LIMIT, or the test's indirect parameter)
    under load on every replica (admitting, streams in flight); the load stops after
    the test body, however it ends."""
    limit = int(getattr(request, "param", LIMIT))
    team_id, key = ha.team_key(f"aimed-{request.node.name}"[:60], limit)
    since = len(base._ledger(ha))
    load = Load(ha=ha, team_id=team_id, key=key)
    worker = load.run()
    try:
        load.first_admitted_after(time.monotonic() - 60, 60)
        time.sleep(2)  # streams in flight, the budget binding
        yield Run(ha=ha, load=load, since=since, worker=worker, limit=limit)
    finally:
        load.stop.set()
        worker.join(timeout=120)
        for gw in ha.gateways:  # a test that failed while replicas were paused
            _signal(gw.popen.pid, signal.SIGCONT)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _primary(ha: HA) -> Member:
    primary = ha.cluster.leader()
    assert primary is not None
    return primary


def _aimed(ha: HA, primary: Member, contains: str, *, calls: int) -> Shot:
    """Stall the primary's WAL senders, then crash it once ``calls`` calls of
    ``contains`` are in flight behind a commit waiting for the standby (the WAL senders
    resumed if that never happens)."""
    stalled = ha.cluster.stop_streaming()
    assert stalled, "no WAL sender found to stall"
    try:
        shot = ha.cluster.crash_when(primary, contains, calls=calls,
                                     wait_event="SyncRep", deadline_s=STALL_DEADLINE_S)
    finally:
        ha.cluster.resume_streaming(stalled)  # dead with the member, unless it failed
    assert shot.aimed and shot.hit, shot  # the kill found its targets running
    return shot


def _window(load: Load, killed: float) -> tuple[float, int]:
    """(seconds from the kill to the first admission after it, requests refused 503)."""
    first = load.first_admitted_after(killed, WINDOW_BOUND_S)
    return first - killed, sum(1 for a in load.answers if a.status == 503)


def _finish(r: Run, *, crashed: list[Member]) -> dict[str, Any]:
    """Stop the load, check the invariants, bring the crashed members back."""
    time.sleep(3)  # load on the new primary
    r.load.stop.set()
    r.worker.join(timeout=120)
    for gw in r.ha.gateways:
        assert gw.popen.poll() is None, gw.logs()
    for m in crashed:  # back as standbys (the check waits for a synchronous one)
        r.ha.cluster.revive(m)
    figures = base._settled_and_checked(r.ha, r.load, since=r.since, limit=r.limit)
    base._replayed(r.ha)
    r.ha.cluster.wait_healthy(deadline_s=120)
    return figures


def _shown(shot: Shot) -> str:
    """What pg_stat_activity showed at the kill: each call, its wait, its age."""
    return ", ".join(f"{r['query']} ({r['wait_event']}, {r['running_ms']} ms)"
                     for r in shot.rows)


def _audit_lines(ha: HA, replica: int, event: str) -> list[dict[str, Any]]:
    data = ha.configs[replica].parent / f"data-{replica}"
    return [line for f in sorted(data.glob("audit-*.jsonl"))
            for raw in f.read_text().splitlines() if raw.strip()
            if (line := json.loads(raw)).get("event") == event]


def _team_permits(ha: HA, team_id: str) -> dict[str, tuple[str, int]]:
    return {str(p): (status, int(usd or 0)) for p, status, usd in ha.sql(
        "SELECT id, status, usd_committed FROM permits WHERE team_id = %s", team_id)}


@pytest.mark.parametrize("run", [base.LIMIT], indirect=True, ids=["binding"])
def test_a_kill_during_admissions_dispatches_nothing_it_did_not_settle(run: Run) -> None:
    """The primary dies while admission calls wait in their commits: none of the
    requests whose admissions were in flight reaches the upstream, a permit the new
    primary holds for one is refunded, and the budget stays exact. ~35 s: Patroni
    promotes only after the leader key's ttl (20 s)."""
    ha, load = run.ha, run.load
    primary = _primary(ha)
    lost_before = _lost_answers(ha)
    stalled = ha.cluster.stop_streaming()  # before the burst: its admissions all stall
    assert stalled, "no WAL sender found to stall"
    try:
        burst = _burst(ha, load, BURST, model="gpt-burst", stream=False)
        shot = ha.cluster.crash_when(primary, ADMIT, calls=3, wait_event="SyncRep",
                                     deadline_s=STALL_DEADLINE_S)
    finally:
        ha.cluster.resume_streaming(stalled)
    assert shot.aimed and shot.hit, shot
    window, refused = _window(load, shot.at)
    burst.join()
    figures = _finish(run, crashed=[primary])
    lost = _lost_answers(ha) - lost_before
    burst_permits = dict(ha.sql("SELECT status, count(*) FROM permits WHERE team_id = %s "
                                "AND model = 'gpt-burst' GROUP BY status", load.team_id))
    sent = [e for e in base._ledger(ha)[run.since:] if e["model"] == "mock-burst"]
    print(f"\nkill during admissions: pg_stat_activity showed {_shown(shot)}; "
          f"{lost} admission call(s) lost their answer; burst "
          f"{sorted(a.status for a in burst.answers)}, its permits {burst_permits}; "
          f"{window:.1f}s without admission, {refused} refused (503); {figures}")
    assert lost >= 1  # the calls the kill hit: the gateways saw their connections die
    # Every burst admission was stuck in its commit until the kill: none was answered,
    # none dispatched; one the new primary holds anyway was refunded (cancelled).
    assert set(a.status for a in burst.answers) <= {402, 503}
    assert sent == []
    assert set(burst_permits) <= {"cancelled"}, burst_permits
    assert window < WINDOW_BOUND_S


def _lost_answers(ha: HA) -> int:
    """Admission calls whose connection died before their answer, as the replicas
    logged them (gateway.governance._postgres's sweep)."""
    return sum(gw.logs().count("may have committed before its connection was lost")
               for gw in ha.gateways)


def test_a_kill_during_settlements_replays_each_once(run: Run) -> None:
    """The primary dies while the settlements of slow streams that ended together wait
    in their commits: each is replayed from its replica's journal on the new primary,
    once. ~35 s: one leader-key ttl (20 s)."""
    ha, load = run.ha, run.load
    primary = _primary(ha)
    burst = _burst(ha, load, BURST, model="gpt-slow", stream=True)
    assert burst.first_done.wait(60), burst.errors
    shot = _aimed(ha, primary, SETTLE, calls=2)
    window, refused = _window(load, shot.at)
    burst.join()
    figures = _finish(run, crashed=[primary])
    stored = _team_permits(ha, load.team_id)
    replayed = [line for r in range(REPLICAS)
                for line in _audit_lines(ha, r, "settlement_replayed")
                if line["permit"] in stored]
    print(f"\nkill during settlements: pg_stat_activity showed {_shown(shot)}; "
          f"{len(replayed)} settlements replayed from the journals; burst "
          f"{sorted(a.status for a in burst.answers)}; {window:.1f}s without admission, "
          f"{refused} refused (503); {figures}")
    assert sum(a.status == 200 for a in burst.answers) >= 2  # streams that ended together
    # The calls the kill hit failed: their settlements went to the journals and were
    # replayed, each permit once (a permit's replays are one line per replica run).
    assert len(replayed) >= len(shot.aimed)
    assert len({line["permit"] for line in replayed}) == len(replayed)


def _backlog(gw_url: str) -> float:
    text = httpx.get(f"{gw_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("mayu_settlement_backlog"))


def _until(ok: Any, deadline_s: float, what: str) -> None:
    end = time.monotonic() + deadline_s
    while not ok():
        assert time.monotonic() < end, what
        time.sleep(0.1)


def test_a_kill_during_a_journal_replay_settles_everything_once(
        run: Run, tmp_path: Path) -> None:
    """A kill during settlements leaves settlements in the replicas' journals; the new
    primary is killed while two replicas replay theirs (a third's replay done on it
    before): every settlement lands once on the third primary, and replaying the
    journals again as they were before any replay changes nothing. ~80 s: two
    leader-key ttls (20 s each) and two members rejoining."""
    ha, load = run.ha, run.load
    primary = _primary(ha)
    successor = ha.cluster.sync_standby()  # the one Patroni may promote
    assert successor is not None
    burst = _burst(ha, load, BURST, model="gpt-slow", stream=True)
    assert burst.first_done.wait(60), burst.errors
    first = _aimed(ha, primary, SETTLE, calls=2)
    # Every stream in flight at the kill ends (4 s) and its settlement fails into its
    # replica's journal; then replicas 1 and 2 pause, before Patroni's promotion (20 s).
    time.sleep(6)
    assert ha.cluster.leader() is not successor
    journals = [ha.configs[r].parent / f"data-{r}" / f"journal-r{r}.jsonl"
                for r in range(REPLICAS)]
    paused = ha.gateways[1:]
    for gw in paused:
        _signal(gw.popen.pid, signal.SIGSTOP)
    copies = [j.read_bytes() for j in journals]
    backlogs = [_open_outcomes(c, tmp_path / f"copy-{r}") for r, c in enumerate(copies)]
    assert backlogs[1] and backlogs[2], backlogs  # the paused replicas have a replay to do
    # The new primary, with a synchronous standby (Patroni would promote no other).
    _until(lambda: ha.cluster.leader() is successor, WINDOW_BOUND_S, "no promotion")
    ha.cluster.wait_healthy(replicas=1, deadline_s=120)
    _until(lambda: _backlog(ha.gateways[0].url) == 0, 60, "replica 0 never replayed")
    ours = _team_permits(ha, load.team_id)
    replayed_first = {line["permit"] for line in _audit_lines(ha, 0, "settlement_replayed")
                      if line["permit"] in ours}
    assert replayed_first
    second = _aimed_at_replay(ha, successor, paused)
    window, refused = _window(load, second.at)
    burst.join()
    figures = _finish(run, crashed=[primary, successor])
    stored = _team_permits(ha, load.team_id)
    # Replica 0's replay, taken by the second primary, survived its crash.
    assert all(stored[p][0] != "pending" for p in replayed_first)
    # The paused replicas' replays were cut by the kill: they ended on the third primary.
    late = [line for r in (1, 2) for line in _audit_lines(ha, r, "settlement_replayed")
            if line["permit"] in stored]
    assert {line["permit"] for line in late} >= set(backlogs[1]) | set(backlogs[2])
    assert all(_after(line["ts"], second) for line in late)
    before = _team_figures(ha, load.team_id), stored
    again = _replay_again(ha, tmp_path, copies)
    assert (_team_figures(ha, load.team_id), _team_permits(ha, load.team_id)) == before
    print(f"\nkill during a replay: first kill {_shown(first)}; replica 0 replayed "
          f"{len(replayed_first)} settlements on the new primary; second kill "
          f"{_shown(second)}; replicas 1-2 replayed {len(late)} settlements after it; "
          f"replaying the journals again: {again}; {window:.1f}s without admission "
          f"after the second kill, {refused} refused (503); {figures}")


def _aimed_at_replay(ha: HA, primary: Member, paused: list[Any]) -> Shot:
    """Stall ``primary``'s WAL senders, resume the paused replicas (their replays start:
    every settlement they send is one, their journals' backlog going first), and crash
    it once their first settlement calls wait in their commits."""
    stalled = ha.cluster.stop_streaming()
    assert stalled, "no WAL sender found to stall"
    try:
        for gw in paused:
            _signal(gw.popen.pid, signal.SIGCONT)
        shot = ha.cluster.crash_when(primary, SETTLE, calls=len(paused),
                                     wait_event="SyncRep", deadline_s=STALL_DEADLINE_S)
    finally:
        ha.cluster.resume_streaming(stalled)
    assert shot.aimed and shot.hit, shot
    return shot


def _open_outcomes(journal: bytes, path: Path) -> list[str]:
    """The permits a journal's bytes leave open with an observed outcome (a replay's
    work)."""
    path.write_bytes(journal)
    return [p for p, e in scan_journal(path).entries.items() if e.settlement is not None]


def _after(ts: str, shot: Shot) -> bool:
    """Whether an audit line's wall-clock ``ts`` is after the (monotonic) kill."""
    killed_wall = time.time() - (time.monotonic() - shot.at)
    return datetime.fromisoformat(ts).timestamp() > killed_wall - 0.05


def _team_figures(ha: HA, team_id: str) -> tuple[int, int, int]:
    [(committed, liability, reserved)] = ha.sql(
        "SELECT coalesce(sum(committed), 0), coalesce(sum(liability), 0), "
        "coalesce(sum(reserved), 0) FROM counters WHERE key LIKE %s",
        f"team:{team_id}:usd:day:%")
    return int(committed), int(liability), int(reserved)


def _replay_again(ha: HA, workdir: Path, copies: list[bytes]) -> dict[str, int]:
    """Start a gateway whose journal is the replicas' journals as copied before any
    replay: at startup it replays every settlement they hold (and settles uncertain any
    permit without one). The store holds them all already: each is answered as a replay
    or refused as a conflict (another settlement stands), and nothing changes."""
    config = base._config(workdir, ha.upstream, 7)
    data = workdir / "data-7"
    data.mkdir(mode=0o700)
    (data / "journal-r7.jsonl").write_bytes(b"".join(copies))
    gw = start_gateway(config)
    try:
        replays = [json.loads(raw) for f in data.glob("audit-*.jsonl")
                   for raw in f.read_text().splitlines() if raw.strip()]
        replays = [line for line in replays if line.get("event") == "settlement_replayed"]
        assert _backlog(gw.url) == 0
    finally:
        gw.stop()
    dropped = gw.logs().count("the store already holds another")
    shutil.rmtree(data, ignore_errors=True)
    outcomes = _open_outcomes(b"".join(copies), workdir / "copies")
    # Each settlement the copies hold was answered as a replay of the stored one.
    assert {line["permit"] for line in replays} == set(outcomes)
    return {"outcomes in the copies": len(outcomes), "replayed": len(replays),
            "dropped (another settlement stands)": dropped}
