"""The soft tier on real processes (ADR-046): a team past its soft budget is served by the
model's cheaper deployment; reserved amounts alone never switch it.

One ``mayu serve`` (local profile; then three shared-profile replicas on one Postgres
database, the policy published by inferplaned) over two mock upstreams, one per
deployment: ``full`` (the model's usual deployment) and ``cheap`` (``routing.soft_tier``,
its own lower price). The soft budgets are policy rules with ``hardCap: false``. The
upstreams' own ledgers say which deployment got each request; the request log and the
audit say which tier served. The shared stack (inferplaned and three gateways) takes
about a minute to start on the loaded test machine; each test is under 30 s.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import psycopg
import pytest
import yaml

from tests.e2e._controlplane import WRITER_TOKEN, start_inferplaned
from tests.e2e._procs import Proc, create_key, create_team, shared_stores, wait_none_pending
from tests.e2e._routing import (
    Routed,
    routed_config,
    start_deployment,
    start_routed_gateway,
)
from tests.e2e.conftest import ADMIN_TOKEN, PRICE

CHEAP = {k: v // 10 for k, v in PRICE.items()}
SPENDER_LIMIT = 1_000  # µUSD: limitMilliUSD 1
BURST_LIMIT = 5_000  # µUSD: limitMilliUSD 5
MODEL = "claude-tiered"
SLOW = "claude-tiered-slow"

POLICY = {
    "apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
    "metadata": {"name": "soft-budgets"},
    "spec": {"rules": [
        {"name": "spender-soft", "subject": {"kind": "team", "team": "spender"},
         "failurePolicy": "FailOpen",
         "budget": {"limitMilliUSD": SPENDER_LIMIT // 1000, "window": "day",
                    "hardCap": False}},
        {"name": "burst-soft", "subject": {"kind": "team", "team": "burst"},
         "failurePolicy": "FailOpen",
         "budget": {"limitMilliUSD": BURST_LIMIT // 1000, "window": "day",
                    "hardCap": False}},
        {"name": "tools-soft", "subject": {"kind": "team", "team": "toolsy"},
         "failurePolicy": "FailOpen",
         "budget": {"limitMilliUSD": 1, "window": "day", "hardCap": False}},
        {"name": "dedupe-soft", "subject": {"kind": "team", "team": "twins"},
         "failurePolicy": "FailOpen",
         "budget": {"limitMilliUSD": 1, "window": "day", "hardCap": False}},
        {"name": "fallback-soft", "subject": {"kind": "team", "team": "falling"},
         "failurePolicy": "FailOpen",
         "budget": {"limitMilliUSD": 1, "window": "day", "hardCap": False}}]}}


@dataclass
class Stack:
    routed: Routed
    workdir: Path

    def client(self, key: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(api_key=key, base_url=self.routed.gateway.url,
                                   max_retries=0, timeout=60)

    def me(self, key: str) -> dict[str, Any]:
        """The team's soft budget as ``GET /v1/me`` lists it."""
        doc = httpx.get(f"{self.routed.gateway.url}/v1/me",
                        headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
        return next(x for x in doc["limits"] if x["kind"] == "account" and not x["hard"])

    def log(self, team: str) -> list[dict[str, Any]]:
        """The admin API's request log of one team, oldest first."""
        r = httpx.get(f"{self.routed.gateway.url}/admin/v1/requests",
                      params={"team": team, "limit": 500},
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30)
        r.raise_for_status()
        return list(reversed(r.json()["data"]))


def _tiered(name: str, full: str, cheap: str) -> dict[str, Any]:
    """A model served by ``full``, with ``cheap`` as its soft tier (a tenth of the price,
    no tool use declared), identical requests deduplicated."""
    return {"name": name, "routing": {
        "strategy": "ordered", "dedupe": True,
        # max_age_s 0: every request reads the budget afresh, so the switch point is
        # exact (the default caches the read for 250 ms).
        "soft_tier": {"deployments": ["cheap"], "max_age_s": 0, "tools": False}},
        "deployments": [{"provider": "full", "name": "full", "upstream_model": full},
                        {"provider": "cheap", "name": "cheap", "price": CHEAP,
                         "upstream_model": cheap}]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("routing-soft")
    (workdir / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    upstreams: dict[str, Proc] = {}
    try:
        for name in ("full", "cheap"):
            upstreams[name] = start_deployment(workdir, prompt_cache=False)
        providers = {"full": "anthropic", "cheap": "anthropic"}
        config = routed_config(workdir, upstreams, providers, [
            _tiered(MODEL, "mock-claude", "mock-claude-haiku"),
            _tiered(SLOW, "mock-claude-slow-stream", "mock-claude-haiku-slow-stream")],
            extra={"policies": [str(workdir / "policy.yaml")]})
        gateway = start_routed_gateway(config)
    except BaseException:
        for proc in upstreams.values():
            proc.stop()
        raise
    routed = Routed(gateway=gateway, upstreams=upstreams, config=config, kinds=providers)
    try:
        yield Stack(routed=routed, workdir=workdir)
    finally:
        routed.stop()


def _ask(client: anthropic.Anthropic, text: str, *, model: str = MODEL, **extra: Any) -> Any:
    return client.messages.with_raw_response.create(
        model=model, max_tokens=64, messages=[{"role": "user", "content": text}], **extra)


def _until_soft(ask: Callable[[int], tuple[int, str]], *, run: int
                ) -> tuple[list[str], list[int], int]:
    """Ask request after request (at most 40; ``ask(i)`` answers the committed + liability
    read before request ``i`` and its tier) until ``run`` in a row were served ``soft``:
    (the tiers, the figures read, the index of the first soft request)."""
    tiers: list[str] = []
    spent_before: list[int] = []
    for i in range(40):
        spent, tier = ask(i)
        spent_before.append(spent)
        tiers.append(tier)
        if tiers[-run:] == ["soft"] * run:
            break
    return tiers, spent_before, tiers.index("soft")


def test_a_team_past_its_soft_budget_is_served_by_the_cheaper_deployment(
        stack: Stack) -> None:
    """Requests go to ``full`` until the team's committed + liability reaches its soft
    limit; the very next request (and every one after it) goes to ``cheap``, is answered
    (not refused), settled at the cheap price, and the request log says ``soft``."""
    key = stack.routed.key("spender")
    client = stack.client(key)
    stack.routed.clear()

    def ask(i: int) -> tuple[int, str]:
        held = stack.me(key)
        raw = _ask(client, f"question {i}: how much is spent?")
        assert raw.http_response.status_code == 200
        return held["committed"] + held["liability"], raw.headers["x-inferplane-tier"]

    tiers, spent_before, switch = _until_soft(ask, run=3)
    print(f"\nlocal: {switch} requests on full, then soft at committed + liability "
          f"{spent_before[switch]} of {SPENDER_LIMIT} µUSD")
    assert switch > 0 and tiers[:switch] == ["standard"] * switch
    assert tiers[switch:] == ["soft"] * (len(tiers) - switch)
    # The switch point is exact: every standard request started under the limit, the
    # first soft one at or past it.
    assert all(s < SPENDER_LIMIT for s in spent_before[:switch])
    assert spent_before[switch] >= SPENDER_LIMIT
    full, cheap = stack.routed.ledger("full"), stack.routed.ledger("cheap")
    assert len(full) == switch and len(cheap) == len(tiers) - switch
    assert {e["model"] for e in cheap} == {"mock-claude-haiku"}
    log = stack.log("spender")
    # The request log's tier: "soft", or none (the usual deployments).
    assert [r["tier"] or "standard" for r in log] == tiers
    assert [r["deployment"] for r in log] == ["full" if t == "standard" else "cheap"
                                              for t in tiers]
    # Settled at each deployment's own price, to the µUSD the upstream reported.
    from gateway.pricing import ModelPrice, Usage, cost_micro_usd
    want = ([cost_micro_usd(Usage(**e["classes"]), ModelPrice(**PRICE)) for e in full]
            + [cost_micro_usd(Usage(**e["classes"]), ModelPrice(**CHEAP)) for e in cheap])
    assert [r["usd_committed"] for r in log] == want
    audit = [json.loads(line) for path in (stack.workdir / "data-mayu").glob("audit*.jsonl")
             for line in path.read_text().splitlines()]
    settled = [a for a in audit if a.get("event") == "settled" and a.get("model") == MODEL
               and a.get("request_id") in {r["request_id"] for r in log}]
    assert sorted(a["tier"] for a in settled) == sorted(tiers)


def test_reserved_but_unsettled_streams_never_switch_the_tier(stack: Stack) -> None:
    """Slow streams (4 s each) started 0.3 s apart: their reservations pass the soft
    limit within the first two, while what is committed + liability stays under it.
    Every one is served by ``full``; mid-burst ``GET /v1/me`` shows reserved above the
    limit and committed + liability below it (so the burst did test the rule)."""
    key = stack.routed.key("burst")
    client = stack.client(key)
    stack.routed.clear()
    n = 8
    samples: list[dict[str, Any]] = []
    go = threading.Event()

    def stream(i: int) -> tuple[str, str]:
        go.wait()
        time.sleep(0.3 * i)
        with client.messages.stream(
                model=SLOW, max_tokens=2000,
                messages=[{"role": "user", "content": f"stream {i}"}]) as s:
            tier = s.response.headers["x-inferplane-tier"]
            text = "".join(s.text_stream)
        return tier, text

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(stream, i) for i in range(n)]
        go.set()
        time.sleep(0.3 * n)  # the last stream has started; the first has not ended
        samples.append(stack.me(key))
        answers = [f.result(timeout=120) for f in futures]
    assert [tier for tier, _ in answers] == ["standard"] * n
    assert all(text for _, text in answers)
    mid = samples[0]
    print(f"\nlocal burst: reserved {mid['reserved']}, committed + liability "
          f"{mid['committed'] + mid['liability']} of {BURST_LIMIT} µUSD; tiers "
          f"{[tier for tier, _ in answers]}")
    assert mid["reserved"] > BURST_LIMIT
    assert mid["committed"] + mid["liability"] < BURST_LIMIT
    assert len(stack.routed.ledger("full")) == n and stack.routed.ledger("cheap") == []
    assert [r["tier"] for r in stack.log("burst")] == [None] * n


def test_a_request_the_cheaper_tier_cannot_serve_keeps_its_deployment(stack: Stack) -> None:
    """The soft tier is declared without tool use (``tools: false``): past the soft
    budget, a request with tools is served by ``full`` and says why; one without tools
    goes to ``cheap``."""
    key = stack.routed.key("toolsy")
    client = stack.client(key)
    _spend_until_soft(client)
    tool = {"name": "lookup", "description": "look a word up",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}
    stack.routed.clear()
    with_tools = _ask(client, "use the tool", tools=[tool])
    plain = _ask(client, "no tools here")
    assert (with_tools.headers["x-inferplane-tier"],
            with_tools.headers["x-inferplane-tier-kept"]) == ("standard", "tools")
    assert plain.headers["x-inferplane-tier"] == "soft"
    assert "x-inferplane-tier-kept" not in plain.headers
    assert (len(stack.routed.ledger("full")), len(stack.routed.ledger("cheap"))) == (1, 1)


def _spend_until_soft(client: anthropic.Anthropic) -> None:
    for i in range(40):  # spend the team's 1,000 µUSD
        if _ask(client, f"spend {i}").headers["x-inferplane-tier"] == "soft":
            return
    raise AssertionError("never switched to the soft tier")


def test_a_failing_soft_tier_falls_back_under_one_request_id(stack: Stack) -> None:
    """The cheap deployment answers 503: a caller past its soft budget is answered by
    ``full`` (its fallback); the request log shows both attempts under the answer's
    request id, attempt 0 on the soft tier (a definite 503: nothing committed), attempt
    1 on the usual deployment."""
    key = stack.routed.key("falling")
    client = stack.client(key)
    _spend_until_soft(client)
    stack.routed.fail("cheap", 503)
    try:
        raw = _ask(client, "the cheap one is down")
    finally:
        stack.routed.heal("cheap")
    assert raw.http_response.status_code == 200
    assert raw.headers["x-inferplane-tier"] == "standard"
    rid = raw.headers["x-inferplane-request-id"]
    rows = [(r["attempt"], r["tier"], r["deployment"], r["http_status"], r["usd_committed"])
            for r in stack.log("falling") if r["request_id"] == rid]
    assert rows[0] == (0, "soft", "cheap", 503, 0)
    assert rows[1][:4] == (1, None, "full", 200) and rows[1][4] > 0
    assert len(rows) == 2


def test_identical_requests_past_the_soft_budget_share_one_soft_answer(stack: Stack) -> None:
    """Three identical non-streamed requests (4 s answers) of a team past its soft budget:
    one call to ``cheap``, three answers, each saying the soft tier served it."""
    key = stack.routed.key("twins")
    _spend_until_soft(stack.client(key))
    stack.routed.clear()
    go = threading.Barrier(3)

    def one(_: int) -> Any:
        go.wait()
        return _ask(stack.client(key), "the same question", model=SLOW)

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(one, range(3)))
    assert [a.http_response.status_code for a in answers] == [200] * 3
    assert [a.headers["x-inferplane-tier"] for a in answers] == ["soft"] * 3
    assert sum("x-inferplane-deduplicated" in a.headers for a in answers) == 2
    assert (len(stack.routed.ledger("full")), len(stack.routed.ledger("cheap"))) == (0, 1)


# -- the shared profile: three replicas on one Postgres database --------------------------


@dataclass
class Shared:
    control: Proc
    gateways: list[Proc]
    upstreams: dict[str, Proc]
    config: Path
    dsn: str

    @property
    def env(self) -> dict[str, str]:
        return {"INFERPLANE_DATABASE_URL": self.dsn}

    def key(self, team: str) -> tuple[str, str]:
        team_id: str = create_team(self.config, team, env=self.env)["id"]
        return team_id, create_key(self.config, team, env=self.env)

    def ledger(self, name: str) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = httpx.get(
            f"{self.upstreams[name].url}/__mock/ledger").json()
        return entries

    def soft_budget(self, gw: Proc, key: str) -> dict[str, Any] | None:
        doc = httpx.get(f"{gw.url}/v1/me", headers={"Authorization": f"Bearer {key}"},
                        timeout=30).json()
        return next((x for x in doc["limits"] if x["kind"] == "account" and not x["hard"]),
                    None)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, pg_module_dsn: str) -> Iterator[Shared]:
    workdir = tmp_path_factory.mktemp("routing-soft-shared")
    procs: list[Proc] = []
    try:
        control = start_inferplaned(workdir, pg_module_dsn)
        procs.append(control)
        upstreams = {name: start_deployment(workdir, prompt_cache=False)
                     for name in ("full", "cheap")}
        procs += upstreams.values()
        providers = {"full": "anthropic", "cheap": "anthropic"}
        models = [{**_tiered(MODEL, "mock-claude", "mock-claude-haiku"), "routing": {
                      "strategy": "ordered", "soft_tier": {"deployments": ["cheap"]}}},
                  _tiered(SLOW, "mock-claude-slow-stream", "mock-claude-haiku-slow-stream")]
        configs = [routed_config(workdir, upstreams, providers, models, name=f"gw{i}",
                                 extra=shared_stores(pool_min_size=1, pool_max_size=4,
                                                     policy_refresh_s=0.5))
                   for i in range(3)]
        gateways = [start_routed_gateway(c, {"INFERPLANE_DATABASE_URL": pg_module_dsn})
                    for c in configs]
        procs += gateways
        yield Shared(control=control, gateways=gateways, upstreams=upstreams,
                     config=configs[0], dsn=pg_module_dsn)
    finally:
        for proc in procs:
            proc.stop()


def _publish(shared: Shared, key: str) -> None:
    """Publish the soft budgets through inferplaned; wait until every replica has them."""
    r = httpx.put(f"{shared.control.url}/v1alpha1/policies/soft-budgets", json=POLICY,
                  headers={"Authorization": f"Bearer {WRITER_TOKEN}"}, timeout=30)
    assert r.status_code in (200, 201), r.text
    deadline = time.monotonic() + 30
    while any(shared.soft_budget(gw, key) is None for gw in shared.gateways):
        assert time.monotonic() < deadline, "the replicas never loaded the policy"
        time.sleep(0.2)


def test_shared_replicas_switch_on_the_shared_figure(shared: Shared) -> None:
    """Three replicas, requests round robin over them, the default 250 ms cache of the
    figure: each request waits until the previous one is settled in the database and
    the cache is older than 250 ms, so the switch point is exact — the first request sent
    once the database's committed + liability reached the limit (whichever replica
    spent it) is the first served by ``cheap``, and every one after it too."""
    team_id, key = shared.key("spender")
    _publish(shared, key)
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}

    def ask(i: int) -> tuple[int, str]:
        wait_none_pending(shared.dsn, team_id=team_id)
        gw = shared.gateways[i % 3]
        held = shared.soft_budget(gw, key)
        assert held is not None
        time.sleep(0.3)  # every replica's cached read is now stale
        r = httpx.post(f"{gw.url}/v1/messages", headers=headers, timeout=60, json={
            "model": MODEL, "max_tokens": 64,
            "messages": [{"role": "user", "content": f"shared question {i}"}]})
        assert r.status_code == 200, r.text
        return held["committed"] + held["liability"], r.headers["x-inferplane-tier"]

    tiers, spent_before, switch = _until_soft(ask, run=4)
    print(f"\nshared: {switch} requests on full over 3 replicas, then soft at "
          f"committed + liability {spent_before[switch]} of {SPENDER_LIMIT} µUSD")
    assert switch > 0 and tiers == ["standard"] * switch + ["soft"] * (len(tiers) - switch)
    assert all(s < SPENDER_LIMIT for s in spent_before[:switch])
    assert spent_before[switch] >= SPENDER_LIMIT
    assert (len(shared.ledger("full")), len(shared.ledger("cheap"))) == (
        switch, len(tiers) - switch)
    wait_none_pending(shared.dsn, team_id=team_id)
    with psycopg.connect(shared.dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT f.deployment, t.tier FROM permits p "
            "JOIN permit_facts f ON f.permit_id = p.id "
            "LEFT JOIN permit_tiers t ON t.permit_id = p.id "
            "WHERE p.team_id = %s ORDER BY p.created_at", (team_id,)).fetchall()
    assert rows == [("full", None)] * switch + [("cheap", "soft")] * (len(tiers) - switch)


def test_shared_reservations_on_three_replicas_never_switch(shared: Shared) -> None:
    """Nine slow streams (4 s each) over the three replicas, started 0.3 s apart: the
    database's reserved passes the soft limit, committed + liability stays under it;
    none is switched."""
    team_id, key = shared.key("burst")
    _publish(shared, key)
    n = 9
    go = threading.Event()

    def stream(i: int) -> str:
        go.wait()
        time.sleep(0.3 * i)
        client = anthropic.Anthropic(api_key=key, base_url=shared.gateways[i % 3].url,
                                     max_retries=0, timeout=60)
        with client.messages.stream(model=SLOW, max_tokens=2000, messages=[
                {"role": "user", "content": f"shared stream {i}"}]) as s:
            tier = s.response.headers["x-inferplane-tier"]
            assert "".join(s.text_stream)
        return tier

    before = len(shared.ledger("cheap"))
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(stream, i) for i in range(n)]
        go.set()
        time.sleep(0.3 * n)
        mid = shared.soft_budget(shared.gateways[0], key)
        tiers = [f.result(timeout=120) for f in futures]
    assert mid is not None
    print(f"\nshared burst: reserved {mid['reserved']}, committed + liability "
          f"{mid['committed'] + mid['liability']} of {BURST_LIMIT} µUSD; tiers {tiers}")
    assert tiers == ["standard"] * n
    assert mid["reserved"] > BURST_LIMIT
    assert mid["committed"] + mid["liability"] < BURST_LIMIT
    assert len(shared.ledger("cheap")) == before
