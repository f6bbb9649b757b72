"""Shared profile end to end: several ``mayu serve`` processes on ONE Postgres database.

Real processes (gateways, mock upstream, a TCP proxy in front of Postgres), real
``openai`` / ``anthropic`` SDK clients. The invariants (DESIGN §9): a hard µUSD budget
is never over-committed across replicas; once everything settled the committed amount
equals the cost computed independently from the upstream's ledger with nothing left
reserved; a gateway killed mid-stream leaves its permit pending and binding; with the
database gone requests fail fast with 503 and never reach the upstream.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import psycopg
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from gateway.governance import BUCKET_SCALE
from gateway.keys import PostgresKeyStore, TeamLimits
from gateway.pricing import ModelPrice, Usage, cost_micro_usd
from tests.conftest import ROOT
from tests.e2e._procs import (
    Proc,
    free_port,
    run_cli,
    shared_replicas,
    shared_stores,
    start_gateway,
    wait_none_pending,
)
from tests.e2e.conftest import PRICE, expected_cost

pytestmark = pytest.mark.e2e

REPLICAS = 3


class Proxy:
    """The TCP proxy process between the gateways and Postgres (stoppable, restartable)."""

    def __init__(self, port: int, host: str, target_port: int) -> None:
        self.port, self._args = port, [str(port), host, str(target_port)]
        self._popen: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self._popen = subprocess.Popen([sys.executable, "-m", "tests.e2e._tcpproxy",
                                        *self._args], cwd=ROOT, stdout=subprocess.PIPE,
                                       text=True)
        assert self._popen.stdout is not None
        assert self._popen.stdout.readline().strip() == "ready"

    def stop(self) -> None:
        if self._popen is not None and self._popen.poll() is None:
            self._popen.kill()
            self._popen.wait()


@dataclass
class Shared:
    dsn: str
    proxy: Proxy
    upstream: Proc
    gateways: list[Proc]
    configs: list[Path]

    def env(self) -> dict[str, str]:
        return {"INFERPLANE_DATABASE_URL": self.dsn}

    def cli(self, *args: str) -> str:
        done = run_cli(*args, "--config", str(self.configs[0]), env=self.env())
        assert done.returncode == 0, done.stderr
        return done.stdout

    def team_key(self, team: str, *limits: str) -> tuple[str, str, str]:
        """(team id, key id, key plaintext), created with the CLI on the shared database."""
        made = json.loads(self.cli("teams", "create", team, "--json", *limits))
        key = json.loads(self.cli("keys", "create", "--team", team, "--json"))
        return made["id"], key["record"]["id"], key["key"]

    def ledger(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = httpx.get(f"{self.upstream.url}/__mock/ledger").json()
        return entries

    def clear_ledger(self) -> None:
        httpx.delete(f"{self.upstream.url}/__mock/ledger").raise_for_status()

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    def team_usd_window(self, team_id: str) -> tuple[int, int]:
        """(committed, reserved) of the team's µUSD day window(s), from the database."""
        [(committed, reserved)] = self.sql(
            "SELECT coalesce(sum(committed), 0), coalesce(sum(reserved), 0) FROM counters"
            " WHERE key LIKE %s", f"team:{team_id}:usd:day:%")
        return int(committed), int(reserved)


# The misbehaving upstreams of the mixed workload (gateway model -> provider, upstream).
_MIXED = {"claude-slow": ("up-anthropic", "mock-slow-stream"),
          "gpt-cut": ("up-openai", "mock-cut-stream"),
          "claude-cut": ("up-anthropic", "mock-cut-stream"),
          "gpt-500": ("up-openai", "mock-error-500"),
          "gpt-missing": ("up-openai", "mock-missing-usage"),
          "claude-nottl": ("up-anthropic", "mock-no-ttl")}


def _config(workdir: Path, upstream: Proc, replica: int) -> Path:
    models = [
        {"name": "gpt-up", "price": PRICE,
         "deployments": [{"provider": "up-openai", "upstream_model": "mock-gpt"}]},
        {"name": "claude-up", "price": PRICE,
         "deployments": [{"provider": "up-anthropic", "upstream_model": "mock-claude"}]},
        {"name": "gpt-slow", "price": PRICE,
         "deployments": [{"provider": "up-openai", "upstream_model": "mock-slow-stream"}]},
        *({"name": name, "price": PRICE,
           "deployments": [{"provider": provider, "upstream_model": upstream}]}
          for name, (provider, upstream) in _MIXED.items()),
    ]
    config = {
        "data_dir": str(workdir / f"data-{replica}"), "demo": False,
        "server": {"replica_id": f"r{replica}"},
        # Coalesced admissions must keep every invariant below.
        **shared_stores(pool_min_size=2, pool_max_size=10, pool_timeout_s=2.0,
                        connect_timeout_s=2.0, admission_coalesce=2),
        "providers": [
            {"name": "up-openai", "kind": "openai", "base_url": f"{upstream.url}/v1",
             "timeout_s": 60},
            {"name": "up-anthropic", "kind": "anthropic", "base_url": upstream.url,
             "timeout_s": 60}],
        "models": models}
    path = workdir / f"mayu-{replica}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def shared(pg_module_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    """One migrated database, a TCP proxy in front of it, 3 gateways behind the proxy."""
    workdir = tmp_path_factory.mktemp("shared")
    dsn = pg_module_dsn
    params = conninfo_to_dict(dsn)
    host, port = str(params.get("host", "127.0.0.1")), int(params.get("port", 5432))
    proxy = Proxy(free_port(), host, port)
    try:
        proxy.start()
        proxy_dsn = dsn.replace(f":{port}/", f":{proxy.port}/")
        with shared_replicas(workdir, _config, range(REPLICAS),
                             env={"INFERPLANE_DATABASE_URL": proxy_dsn}) as (
                upstream, gateways, configs):
            yield Shared(dsn=dsn, proxy=proxy, upstream=upstream, gateways=gateways,
                         configs=configs)
    finally:
        proxy.stop()


def test_replicas_start_and_serve(shared: Shared) -> None:
    """Three replicas on one database authenticate the same key and share its usage."""
    _, _, key = shared.team_key("smoke")
    shared.clear_ledger()
    for gw in shared.gateways:
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
        reply = client.chat.completions.create(
            model="gpt-up", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert reply.usage is not None
    assert len(shared.ledger()) == REPLICAS


N = 330
BUDGET = 30_000
TPM = 1_000_000  # burst 1: the budget binds
TIGHT_TPM = 50  # burst 2: below one call's TPM estimate (body/4): the bucket binds


async def _set_team_limits(dsn: str, team_id: str, limits: TeamLimits) -> None:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1, open=False) as pool:
        await PostgresKeyStore(pool).update_team(team_id, limits=limits)


async def _call(gw: Proc, key: str, i: int, *, big_every: int = 3) -> int:
    """One SDK call (4 shapes: OpenAI/Anthropic x stream/non-stream, with cache usage);
    returns the HTTP status the SDK saw."""
    prompt = f"shared request {i} " * (12 + i % 9)  # long enough for cached tokens
    # Some calls ask for a large output they will not use: a large µUSD bound in flight.
    out = 1_500 if big_every and i % big_every == 0 else 16 + i % 7
    try:
        if i % 4 in (0, 1):
            await _openai_call(gw, key, prompt, out, stream=i % 4 == 1)
        else:
            ttl = {"ttl": "1h"} if i % 8 == 2 else {}
            await _anthropic_call(gw, key, prompt, out, ttl, stream=i % 4 == 3)
    except (openai.APIStatusError, anthropic.APIStatusError) as exc:
        return exc.status_code
    return 200


async def _openai_call(gw: Proc, key: str, prompt: str, out: int, *, stream: bool) -> None:
    messages: Any = [{"role": "user", "content": prompt}]
    async with openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0,
                                  timeout=120) as client:
        if not stream:
            await client.chat.completions.create(model="gpt-up", max_tokens=out,
                                                 messages=messages)
            return
        chunks = await client.chat.completions.create(model="gpt-up", max_tokens=out,
                                                      messages=messages, stream=True)
        async for _ in chunks:
            pass


async def _anthropic_call(gw: Proc, key: str, prompt: str, out: int, ttl: dict[str, str],
                          *, stream: bool) -> None:
    system: Any = [{"type": "text", "text": prompt,
                    "cache_control": {"type": "ephemeral", **ttl}}]
    messages: Any = [{"role": "user", "content": "go"}]
    async with anthropic.AsyncAnthropic(base_url=gw.url, api_key=key, max_retries=0,
                                        timeout=120) as client:
        if not stream:
            await client.messages.create(model="claude-up", max_tokens=out, system=system,
                                         messages=messages)
            return
        async with client.messages.stream(model="claude-up", max_tokens=out, system=system,
                                          messages=messages) as events:
            async for _ in events:
                pass


def test_hot_team_budget_and_tpm_hold_across_replicas(shared: Shared) -> None:
    """330 + 200 concurrent SDK calls (stream and not, OpenAI and Anthropic, with cache
    usage) spread over 3 replicas on one team: committed never exceeds the budget, and
    after all settled committed == the cost of the upstream's ledger, nothing reserved."""
    team_id, _, key = shared.team_key("hot", "--usd-micros-per-day", str(BUDGET),
                                      "--tpm", str(TPM))
    shared.clear_ledger()

    async def burst(n: int, big_every: int) -> list[int]:
        return await asyncio.gather(*(_call(shared.gateways[i % REPLICAS], key, i,
                                            big_every=big_every) for i in range(n)))

    # Burst 1: large bounds in flight exhaust the budget's headroom (402).
    first = Counter(asyncio.run(burst(N, 3)))
    assert first[402] > 0, first
    # Burst 2: the team's TPM is tightened (an admin edit, new team revision), and small
    # calls drain the bucket (429) while the budget still holds its committed spend.
    asyncio.run(_set_team_limits(shared.dsn, team_id, TeamLimits(
        usd_micros_per_day=BUDGET, tpm=TIGHT_TPM)))
    second = Counter(asyncio.run(burst(200, 0)))
    assert second[429] > 0, second
    statuses = first + second
    # The answers left before the store took their settlements: read once none is pending.
    wait_none_pending(shared.dsn, team_id=team_id)
    committed, reserved = shared.team_usd_window(team_id)
    ledger = shared.ledger()
    reported = sum(expected_cost(e) for e in ledger)
    print(f"\nstatuses {dict(first)} then {dict(second)}: committed {committed} of {BUDGET}")
    assert set(statuses) <= {200, 402, 429}, statuses
    assert statuses[200] == len(ledger)
    assert reserved == 0
    assert committed == reported
    assert committed <= BUDGET
    [(balance, cap)] = shared.sql('SELECT balance, "limit" FROM counters WHERE key = %s',
                                  f"team:{team_id}:tpm")
    assert cap == TIGHT_TPM and balance <= TIGHT_TPM * BUCKET_SCALE
    # Every replica served part of the load and audited it in its own file.
    for r in range(REPLICAS):
        audit = shared.configs[r].parent / f"data-{r}" / f"audit-r{r}.jsonl"
        assert audit.read_text().count("\n") > N // (2 * REPLICAS), audit


def _chat(gw: Proc, key: str, max_tokens: int) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/chat/completions", timeout=60,
                      headers={"Authorization": f"Bearer {key}"},
                      json={"model": "gpt-up", "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": "hello"}]})


def test_shared_refusals_carry_their_numbers_in_both_shapes(shared: Shared) -> None:
    """A money refusal from the shared store says the limit, committed, liability,
    reserved, the worst case, the largest max_tokens that fits and the reset, in the
    OpenAI shape (insufficient_quota) and the Anthropic one (billing_error); before
    anything is spent, the same request is the request's own error (400), not a spent
    limit."""
    _, _, key = shared.team_key("shared-402", "--usd-micros-per-day", "20000")
    gw = shared.gateways[0]
    r = _chat(gw, key, 20_000)  # 20,000 output tokens at $4/Mtok: 80,000 µUSD worst case
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens <= " in r.json()["error"]["message"]
    assert _chat(gw, key, 8).status_code == 200  # something spent: now a spent limit
    r = _chat(gw, key, 20_000)
    assert r.status_code == 402
    error = r.json()["error"]
    assert error["code"] == "insufficient_quota"
    for words in ("limit 20000 µUSD", "committed ", "liability 0", "reserved 0",
                  "worst case", "max_tokens <= ", "window resets at"):
        assert words in error["message"], error["message"]
    assert "retry-after" not in r.headers and r.headers["x-should-retry"] == "false"
    a = httpx.post(f"{gw.url}/v1/messages", timeout=60,
                   headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
                   json={"model": "claude-up", "max_tokens": 20_000,
                         "messages": [{"role": "user", "content": "hello"}]})
    assert a.status_code == 402
    body = a.json()
    assert body["type"] == "error" and body["error"]["type"] == "billing_error"
    assert "max_tokens <= " in body["error"]["message"]


def test_revoked_on_one_replica_is_refused_on_the_others(shared: Shared) -> None:
    """A key revoked with the CLI on the shared database is refused (401) by every replica
    at its next request, with no upstream call."""
    _, key_id, key = shared.team_key("revoked")
    assert _chat(shared.gateways[1], key, 8).status_code == 200
    shared.cli("keys", "revoke", key_id)
    shared.clear_ledger()
    for gw in shared.gateways:
        r = _chat(gw, key, 8)
        assert r.status_code == 401, r.text
    assert shared.ledger() == []


def test_team_edited_after_its_key_was_used_binds_at_the_next_request(shared: Shared) -> None:
    """A replica that just planned with a key's Principal (kept for the next requests)
    admits the very next one under the team's new limits: admission refuses the stale
    revision and the key is read again, with no upstream call."""
    team_id, _, key = shared.team_key("edited")
    assert _chat(shared.gateways[0], key, 8).status_code == 200
    asyncio.run(_set_team_limits(shared.dsn, team_id, TeamLimits(tokens_per_day=1)))
    shared.clear_ledger()
    r = _chat(shared.gateways[0], key, 8)
    assert r.status_code == 429, r.text
    assert shared.ledger() == []

async def _mixed_one(gw: Proc, key: str, kind: str, i: int) -> str:
    """One request of the mixed workload; returns how it ended for the client."""
    prompt = f"mixed {kind} {i} " * (10 + i % 7)
    messages: Any = [{"role": "user", "content": prompt}]
    system: Any = [{"type": "text", "text": prompt,
                    "cache_control": {"type": "ephemeral", **({"ttl": "1h"} if i % 2 else {})}}]
    oa = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0, timeout=120)
    an = anthropic.AsyncAnthropic(base_url=gw.url, api_key=key, max_retries=0, timeout=120)
    try:
        if kind == "chat":
            await oa.chat.completions.create(model="gpt-up", max_tokens=30, messages=messages)
        elif kind == "chat-stream":
            async for _ in await oa.chat.completions.create(
                    model="gpt-up", max_tokens=30, messages=messages, stream=True):
                pass
        elif kind == "responses":
            await oa.responses.create(model="gpt-up", max_output_tokens=30, input=prompt)
        elif kind == "responses-stream":
            async for _ in await oa.responses.create(model="gpt-up", max_output_tokens=30,
                                                     input=prompt, stream=True):
                pass
        elif kind == "embeddings":
            await oa.embeddings.create(model="gpt-up", input=prompt)
        elif kind == "messages":
            await an.messages.create(model="claude-up", max_tokens=30, system=system,
                                     messages=[{"role": "user", "content": "go"}])
        elif kind == "messages-stream":
            async with an.messages.stream(model="claude-up", max_tokens=30, system=system,
                                          messages=[{"role": "user", "content": "go"}]) as s:
                async for _ in s:
                    pass
        elif kind == "no-ttl":  # a 1h breakpoint: the unsplit writes may be 5m or 1h
            system[0]["cache_control"]["ttl"] = "1h"
            await an.messages.create(model="claude-nottl", max_tokens=30, system=system,
                                     messages=[{"role": "user", "content": "go"}])
        elif kind == "error-500":
            await oa.chat.completions.create(model="gpt-500", max_tokens=30, messages=messages)
        elif kind == "missing-usage":
            await oa.chat.completions.create(model="gpt-missing", max_tokens=30,
                                             messages=messages)
        elif kind == "upstream-cut":
            async for _ in await oa.chat.completions.create(
                    model="gpt-cut", max_tokens=30, messages=messages, stream=True):
                pass
        elif kind == "upstream-cut-anthropic":
            async with an.messages.stream(model="claude-cut", max_tokens=30,
                                          messages=messages) as s:
                async for _ in s:
                    pass
        elif kind == "client-disconnect":
            seen = 0
            async with httpx.AsyncClient(base_url=gw.url, timeout=60) as client, \
                    client.stream("POST", "/v1/messages", headers={
                        "x-api-key": key, "anthropic-version": "2023-06-01"},
                        json={"model": "claude-slow", "max_tokens": 40, "stream": True,
                              "system": system, "messages": [{"role": "user",
                                                              "content": "go"}]}) as r:
                async for chunk in r.aiter_bytes():
                    seen += chunk.count(b"\n\n")
                    if seen >= 3:
                        break
            return "disconnected"
    except (openai.APIError, anthropic.APIError) as exc:
        return f"raised {type(exc).__name__}"
    finally:
        await oa.close()
        await an.close()
    return "ok"


_KINDS = ("chat", "chat-stream", "responses", "responses-stream", "embeddings", "messages",
          "messages-stream", "no-ttl", "error-500", "missing-usage", "upstream-cut",
          "upstream-cut-anthropic", "client-disconnect")


def test_mixed_workload_commits_what_the_upstream_reported(shared: Shared) -> None:
    """Every shape, cache classes, cuts, disconnects, 500s and missing usage over 3
    replicas: Σ committed of the requests whose usage was reported equals the upstream
    ledger priced independently; every other permit brackets its truth
    (committed ≤ truth ≤ committed + liability); nothing stays pending or reserved."""
    team_id, _, key = shared.team_key("mixed", "--usd-micros-per-day", str(10**9))
    shared.clear_ledger()

    async def run() -> list[str]:
        return await asyncio.gather(*(
            _mixed_one(shared.gateways[i % REPLICAS], key, kind, i)
            for i, kind in enumerate(_KINDS * 3)))
    endings = asyncio.run(run())
    by_kind = dict(zip(_KINDS * 3, endings, strict=True))
    assert by_kind["upstream-cut"].startswith("raised")
    assert by_kind["upstream-cut-anthropic"].startswith("raised")
    assert by_kind["error-500"].startswith("raised") and by_kind["chat"] == "ok"
    wait_none_pending(shared.dsn, team_id=team_id)
    rows = shared.sql("SELECT model, status, usd_committed, usd_liability, usd_bound"
                      " FROM permits WHERE team_id = %s", team_id)
    ledger = shared.ledger()
    price = ModelPrice(**PRICE)
    # Reported usage: complete permits (and the 5m end of tokens_known) equal the ledger.
    complete = [e for e in ledger if e["classes"] and not e["classes"]["cache_write_unknown"]]
    unknown = [e for e in ledger if e["classes"] and e["classes"]["cache_write_unknown"]]
    assert sum(c for m, st, c, _, _ in rows if st == "complete") == sum(
        expected_cost(e) for e in complete)
    cheap = [_fold(e, "cache_write_5m") for e in unknown]
    dear = [_fold(e, "cache_write_1h") for e in unknown]
    known = [(c, li) for m, st, c, li, _ in rows if st == "tokens_known"]
    assert len(known) == len(unknown) == 3
    assert sum(c for c, _ in known) == sum(cost_micro_usd(u, price) for u in cheap)
    assert sum(c + li for c, li in known) == sum(cost_micro_usd(u, price) for u in dear)
    # Unobserved remainders: each uncertain permit's truth lies in its bracket, and the
    # bracket is exactly its bound.
    uncertain = [(m, c, li, b) for m, st, c, li, b in rows if st == "uncertain"]
    assert {m for m, *_ in uncertain} == {"gpt-missing", "gpt-cut", "claude-cut",
                                          "claude-slow"}
    for model, committed, liability, bound in uncertain:
        assert committed + liability == bound and committed < bound, model
    [(reserved,)] = shared.sql("SELECT coalesce(sum(reserved), 0) FROM counters"
                               " WHERE key LIKE %s", f"team:{team_id}:%")
    assert reserved == 0


def _fold(entry: dict[str, Any], into: str) -> Usage:
    classes = dict(entry["classes"])
    unknown = classes.pop("cache_write_unknown")
    classes[into] += unknown
    return Usage(**classes)


CRASH_BUDGET = 20_000


def test_killed_replica_leaves_pending_permit_that_binds(shared: Shared) -> None:
    """SIGKILL a replica mid-stream: its permit stays pending with its whole bound reserved,
    the other replicas refuse what would fit without it (402); restarted on its data dir
    the replica settles it from its journal (uncertain: the bound becomes liability)."""
    team_id, _, key = shared.team_key("crash", "--usd-micros-per-day", str(CRASH_BUDGET))
    victim = shared.gateways.pop()  # later tests use the survivors
    body = {"model": "gpt-slow", "max_tokens": 4_000, "stream": True,
            "messages": [{"role": "user", "content": "a long story please"}]}
    with httpx.Client(base_url=victim.url, timeout=60) as client, client.stream(
            "POST", "/v1/chat/completions", json=body,
            headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status_code == 200
        permit, usd_bound = r.headers["x-inferplane-permit"], int(
            r.headers["x-inferplane-usd-bound"])
        chunks = r.iter_bytes()  # held: dropping the generator could close the stream
        next(chunks)
        victim.popen.send_signal(signal.SIGKILL)
        victim.popen.wait()
    victim.stop()
    [(status, detail)] = shared.sql("SELECT status, detail FROM permits WHERE id = %s",
                                    permit)
    assert status == "pending", detail
    assert shared.team_usd_window(team_id) == (0, usd_bound)
    # 1000 output tokens at $4/Mtok alone is 4000 µUSD: it fits the empty budget, but not
    # beside the dead replica's pending reservation.
    assert usd_bound + 4_000 > CRASH_BUDGET >= 4_000 * 2
    for gw in shared.gateways:
        r = _chat(gw, key, 1_000)
        assert r.status_code == 402, r.text
    assert shared.team_usd_window(team_id) == (0, usd_bound)
    assert [p for (p,) in shared.sql("SELECT id::text FROM permits WHERE status = 'pending'"
                                     " AND team_id = %s", team_id)] == [permit]
    # Restarted on its own data dir, the replica resolves it from its journal before
    # serving: dispatched, outcome never observed -> uncertain; its bound is liability.
    config = shared.configs[len(shared.gateways)]
    proxy_env = {"INFERPLANE_DATABASE_URL": shared.dsn}
    restarted = start_gateway(config, env=proxy_env)
    try:
        [(status, detail, committed, liability)] = shared.sql(
            "SELECT status, detail, usd_committed, usd_liability FROM permits WHERE id = %s",
            permit)
        assert (status, committed, liability) == ("uncertain", 0, usd_bound)
        assert "replica restarted: dispatched" in detail
    finally:
        restarted.stop()


def test_database_down_fails_fast_without_upstream_calls(shared: Shared) -> None:
    """With the database unreachable every request is refused with 503 + Retry-After and
    the upstream receives nothing; when it comes back the replicas serve again."""
    _, _, key = shared.team_key("outage")
    shared.clear_ledger()
    shared.proxy.stop()
    try:
        for gw in shared.gateways:
            for _ in range(3):
                r = _chat(gw, key, 8)
                assert r.status_code == 503, r.text
                assert r.headers.get("retry-after") is not None
                assert r.json()["error"]["code"] == "governance_unavailable"
        assert shared.ledger() == []
    finally:
        shared.proxy.start()
    # Pooled connections broke with the proxy: the first failure makes the replica check
    # its whole pool, so it serves again after a few refusals (bounded, not timed).
    for gw in shared.gateways:
        statuses: list[int] = []
        while len(statuses) < 20 and 200 not in statuses:
            statuses.append(_chat(gw, key, 8).status_code)
        assert statuses[-1] == 200 and set(statuses) <= {200, 503}, statuses


def test_database_outage_while_streams_finish(shared: Shared) -> None:
    """The database goes away for 15 s while streams run: every stream still ends on time
    for its client; once it is back the journaled settlements are replayed, no observed
    permit stays pending, and committed equals the upstream ledger's cost."""
    team_id, _, key = shared.team_key("outage-streams", "--usd-micros-per-day", "100000000")
    shared.clear_ledger()
    body = {"model": "gpt-slow", "max_tokens": 40, "stream": True,
            "messages": [{"role": "user", "content": "a long story please"}]}
    durations: list[float] = []

    def one(gw: Proc) -> None:
        started = time.monotonic()
        with httpx.Client(base_url=gw.url, timeout=60) as client, client.stream(
                "POST", "/v1/chat/completions", json=body,
                headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status_code == 200
            text = b"".join(r.iter_bytes())
        assert b"[DONE]" in text
        durations.append(time.monotonic() - started)

    threads = [threading.Thread(target=one, args=(gw,)) for gw in shared.gateways * 2]
    for t in threads:
        t.start()
    time.sleep(1.0)  # admitted and streaming; settlement will find no database
    shared.proxy.stop()
    try:
        for t in threads:
            t.join(timeout=30)
        # A slow stream takes ~4 s; ending "on time" means not waiting for the database.
        assert len(durations) == len(threads) and max(durations) < 8, durations
        time.sleep(max(0.0, 15 - 1 - max(durations)))
    finally:
        shared.proxy.start()
    wait_none_pending(shared.dsn, team_id=team_id)
    ledger = shared.ledger()
    assert len(ledger) == len(threads)
    [(committed, liability)] = shared.sql(
        "SELECT sum(usd_committed), sum(usd_liability) FROM permits WHERE team_id = %s",
        team_id)
    assert committed == sum(expected_cost(e) for e in ledger) and liability == 0
