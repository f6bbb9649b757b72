"""A $2/day member inside a $10/day team, under concurrent load on 3 shared replicas.

Real processes: three ``mayu serve`` on one Postgres database, ``mayu mock-upstream``, the
real ``openai`` SDK. The budget is set through the admin API of one replica; ana holds a
key on each replica (three keys, one member budget), bob and carol hold theirs. Every
user's requests go to their own model name, so the upstream's ledger tells whose usage it
reported. Prices are high (a request's worst case is 148,003 µUSD, 1.5 % of the team's
budget; it costs 42,000) so the budgets are reached in ~250 requests; ana sends half of
them, so the team has room when her own budget refuses her (all twelve workers' worst
cases reserved at once are 18 % of the team's budget).

What must hold: ana's committed + liability never passes $2 and the team's never $10,
both by the database's counters and by the upstream's own record; ana is refused with
her member counter while bob and carol keep being served (their requests after ana's
first refusal succeed) until the team's own budget refuses them.

About 7-15 s: ~5 s to start the mock and three gateways, then ~80 requests per replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest

from gateway.governance import CounterKey, utc_windows
from gateway.pricing import ModelPrice, Usage, cost_micro_usd
from tests.e2e._procs import Proc, replica_config, start_gateway, start_mock_upstream

pytestmark = pytest.mark.e2e

REPLICAS = 3
WRITE = "member-admin-write-token"
MEMBER_DAY, TEAM_DAY = 2_000_000, 10_000_000
# µUSD per million tokens: 1,000 µUSD per input token, 4,000 per output token.
PRICE = {"input": 1_000_000_000, "output": 4_000_000_000, "cache_read": 100_000_000,
         "cache_write_5m": 1_250_000_000, "cache_write_1h": 2_000_000_000}
USERS = ("ana", "bob", "carol")


def _config(workdir: Path, upstream: Proc, replica: int) -> Path:
    # The mock adds no tokens beyond the body, so no provider overhead in the bound.
    models = [{"name": f"m-{u}", "price": PRICE, "input_overhead_tokens": 0,
               "deployments": [{"provider": "up", "upstream_model": f"mock-gpt-{u}"}]}
              for u in USERS]
    return replica_config(workdir, replica, upstream, models, server={"admin_tokens": [
        {"name": "terraform", "token_ref": "env:IPT_ADMIN_WRITE", "access": "write"}]},
        pool_min_size=2, pool_max_size=8, admission_coalesce=2)


@dataclass
class Cluster:
    dsn: str
    upstream: Proc
    gateways: list[Proc]
    team_id: str = ""
    keys: dict[str, list[str]] = field(default_factory=dict)
    """Per user, one key per replica."""

    def counter(self, name: str) -> tuple[int, int, int]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT committed, liability, reserved FROM counters "
                               "WHERE key = %s", (name,)).fetchone()
        return (0, 0, 0) if row is None else (row[0], row[1], row[2])


@pytest.fixture(scope="module")
def cluster(pg_module_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("members")
    dsn = pg_module_dsn
    env = {"INFERPLANE_DATABASE_URL": dsn, "IPT_ADMIN_WRITE": WRITE}
    procs: list[Proc] = []
    try:
        upstream = start_mock_upstream(workdir, latency_ms=10)
        procs.append(upstream)
        gateways = [start_gateway(_config(workdir, upstream, i), env=env)
                    for i in range(REPLICAS)]
        procs += gateways
        c = Cluster(dsn=dsn, upstream=upstream, gateways=gateways)
        admin = httpx.Client(base_url=gateways[0].url,
                             headers={"Authorization": f"Bearer {WRITE}"})
        made = admin.post("/admin/v1/teams", json={
            "name": "eng", "limits": {"usd_micros_per_day": TEAM_DAY}})
        assert made.status_code == 201, made.text
        c.team_id = made.json()["id"]
        put = admin.put("/admin/v1/teams/eng/members/ana",
                        json={"usd_micros_per_day": MEMBER_DAY})
        assert put.status_code == 201, put.text
        for user in USERS:
            c.keys[user] = []
            for _ in range(REPLICAS):
                key = admin.post("/admin/v1/keys", json={"team": "eng", "user": user})
                assert key.status_code == 201, key.text
                c.keys[user].append(key.json()["secret"])
        yield c
    finally:
        for proc in procs:
            proc.stop()


@dataclass
class Outcome:
    user: str
    at: float
    status: int
    message: str = ""


async def _worker(c: Cluster, user: str, replica: int, out: list[Outcome]) -> None:
    """Requests on the user's key of one replica until a refusal."""
    client = openai.AsyncOpenAI(base_url=f"{c.gateways[replica].url}/v1",
                                api_key=c.keys[user][replica], max_retries=0)
    loop = asyncio.get_running_loop()
    try:
        for i in range(400):  # a guard: the budgets end every worker long before
            try:
                await client.chat.completions.create(
                    model=f"m-{user}", max_tokens=16,
                    messages=[{"role": "user", "content": f"{user} {replica} {i}"}])
                out.append(Outcome(user, loop.time(), 200))
            except openai.APIStatusError as exc:
                body: Any = exc.body
                message = body.get("message", "") if isinstance(body, dict) else str(body)
                out.append(Outcome(user, loop.time(), exc.status_code, message))
                return
    finally:
        await client.close()


def _ledger_usd(c: Cluster) -> dict[str, int]:
    entries = httpx.get(f"{c.upstream.url}/__mock/ledger").json()
    spent = dict.fromkeys(USERS, 0)
    for e in entries:
        user = e["model"].removeprefix("mock-gpt-")
        spent[user] += cost_micro_usd(Usage(**e["classes"]), ModelPrice(**PRICE))
    return spent


def test_a_member_budget_holds_across_three_replicas_and_the_others_are_served(
        cluster: Cluster) -> None:
    c = cluster
    day, _ = utc_windows(datetime.now(UTC))
    member = CounterKey.member(c.team_id, "ana").windowed("usd", "day", day).text
    team = CounterKey.team(c.team_id).windowed("usd", "day", day).text

    async def run() -> list[Outcome]:
        out: list[Outcome] = []
        # ana: two workers per replica, bob and carol one each, all at once.
        await asyncio.gather(*(_worker(c, user, r, out) for user in USERS
                               for r in range(REPLICAS)
                               for _ in range(2 if user == "ana" else 1)))
        return out
    outcomes = asyncio.run(run())

    ledger = _ledger_usd(c)
    committed, liability, reserved = c.counter(member)
    assert reserved == 0 and committed + liability <= MEMBER_DAY, (committed, liability)
    assert committed == ledger["ana"]  # the gateway committed what the upstream reported
    t_committed, t_liability, t_reserved = c.counter(team)
    assert t_reserved == 0 and t_committed + t_liability <= TEAM_DAY
    assert t_committed == sum(ledger.values()) <= TEAM_DAY

    ana_refusals = [o for o in outcomes if o.user == "ana" and o.status != 200]
    assert len(ana_refusals) == 2 * REPLICAS  # every ana worker ended on a refusal:
    for o in ana_refusals:  # her member budget's, with its figures
        assert o.status == 402 and member in o.message, o
        assert f"limit {MEMBER_DAY} µUSD would be exceeded: committed " in o.message
    # ana was held to her budget, not the team's: she reached most of it.
    assert committed > MEMBER_DAY // 2
    first_refusal = min(o.at for o in ana_refusals)
    later = [o for o in outcomes if o.user != "ana" and o.status == 200
             and o.at > first_refusal]
    assert len(later) >= 10, "bob and carol were not served after ana's refusal"
    others = [o for o in outcomes if o.user != "ana" and o.status != 200]
    assert others and all(o.status == 402 and team in o.message for o in others), others
    assert ledger["bob"] + ledger["carol"] > MEMBER_DAY  # they spent past ana's cap
