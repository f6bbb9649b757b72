"""The hard-limit guarantee when the provider's count is wrong, across 3 shared replicas.

Three ``mayu serve`` replicas of the shared profile on one migrated Postgres, in front of
an upstream whose ``count_tokens`` answers :data:`PERCENT` % of what it then bills
(``tests/e2e/_undercount.py``). A $1/day team at Opus prices runs Claude-Code-shaped
sessions (``tests/bench/agent_budget.py``, ``max_tokens`` 1024 so a turn's bound is
mostly its input) on the three replicas at once until each is refused. A turn bounded by
the (wrong) count is billed more input than its permit reserved: docs/bounds.md, "When
the provider's count is wrong", says what the team may then pass its limit by, and how
each such permit is flagged. ~30 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anthropic
import httpx
import psycopg
import pytest

from gateway.catalog import builtin_catalog
from gateway.pricing import ModelPrice, Usage, cost_bound_micro_usd, cost_micro_usd
from tests.bench.agent_budget import MODEL, config_file, turn
from tests.e2e._procs import (
    ROOT,
    Proc,
    _env,
    free_port,
    run_cli,
    start_gateway,
    wait_none_pending,
    wait_ready,
)

pytestmark = pytest.mark.e2e

LIMIT, FLOOR, PERCENT, REPLICAS, MAX_TOKENS = 1_000_000, 1024, 10, 3, 1024
CLASSES_5M = frozenset(("input", "cache_read", "cache_write_5m"))
"""The classes a 5m-marked Claude Code turn's input can be billed in."""


def _shared() -> dict[str, object]:
    return {"key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
            "database": {"dsn_ref": "env:INFERPLANE_DATABASE_URL", "pool_min_size": 1,
                         "pool_max_size": 4}}


def _undercounting_upstream(workdir: Path) -> Proc:
    port = free_port()
    log_path = workdir / f"undercount-{port}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e._undercount", "--port", str(port),
             "--percent", str(PERCENT)],
            stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=str(ROOT))
    return wait_ready(Proc(popen=popen, port=port, log_path=log_path))


def _session(gateway: Proc, key: str, first: int, answers: list[dict[str, Any]]) -> None:
    """Turns ``first``, ``first + 3``, … on one replica until it refuses one."""
    client = anthropic.Anthropic(base_url=gateway.url, api_key=key, max_retries=0,
                                 timeout=60)
    for t in range(first, first + 3 * 20, REPLICAS):
        try:
            client.messages.create(**{**turn(t), "max_tokens": MAX_TOKENS})
        except anthropic.APIStatusError as exc:
            answers.append({"turn": t, "status": exc.status_code, "message": exc.message})
            return
        answers.append({"turn": t, "status": 200})


def _price() -> ModelPrice:
    entry = builtin_catalog().get(MODEL)
    assert entry is not None
    return entry.price


def _flagged_metric(gateways: list[Proc]) -> int:
    total = 0.0
    for g in gateways:
        for line in httpx.get(f"{g.url}/metrics").text.splitlines():
            if line.startswith("mayu_bound_exceeded_total{"):
                total += float(line.rsplit(" ", 1)[1])
    return int(total)


def test_an_undercounting_provider_passes_the_limit_by_at_most_the_flagged_excess(
        tmp_path: Path, pg_dsn: str) -> None:
    """With count_tokens answering 10 % of what it bills, the team's committed total is
    the upstream's own ledger, passes the $1 limit by at most the excess over their
    bounds of the permits in flight at its last admission (each at most its uncounted
    input at the dearest input class), and every permit that billed above its bound is
    flagged bound_exceeded (audit line, request log, mayu_bound_exceeded_total, the
    gateway's warning)."""
    env = {"INFERPLANE_DATABASE_URL": pg_dsn}
    upstream = _undercounting_upstream(tmp_path)
    gateways: list[Proc] = []
    answers: list[dict[str, Any]] = []
    try:
        configs = [config_file(tmp_path, upstream, None, shared=_shared(), name=f"gw{i}")
                   for i in range(REPLICAS)]
        gateways = [start_gateway(config, env=env) for config in configs]
        made = run_cli("teams", "create", "small", "--config", str(configs[0]), "--json",
                       "--usd-micros-per-day", str(LIMIT), "--budget-fit-floor", str(FLOOR),
                       env=env)
        assert made.returncode == 0, made.stderr
        team_id = json.loads(made.stdout)["id"]
        created = run_cli("keys", "create", "--team", "small", "--config", str(configs[0]),
                          "--json", env=env)
        assert created.returncode == 0, created.stderr
        key = json.loads(created.stdout)["key"]
        threads = [threading.Thread(target=_session, args=(g, key, i, answers))
                   for i, g in enumerate(gateways)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        wait_none_pending(pg_dsn, team_id=team_id)
        flagged_metric = _flagged_metric(gateways)
        ledger = httpx.get(f"{upstream.url}/__mock/ledger").json()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            permits = conn.execute(
                "SELECT id::text, usd_bound, usd_committed, usd_liability, bound_exceeded, "
                "status, token_bound, tokens_committed FROM permits WHERE team_id = %s",
                (team_id,)).fetchall()
    finally:
        for proc in gateways:
            proc.stop()
        upstream.stop()
    price = _price()
    upstream_usd = sum(cost_micro_usd(Usage(**e["classes"]), price)
                       for e in ledger if e["classes"])
    settled = [p for p in permits if p[5] != "cancelled"]
    committed = sum(p[2] or 0 for p in settled)
    excess = {p[0]: (p[2] or 0) - p[1] for p in settled if (p[2] or 0) > p[1]}
    above = {p[0] for p in settled if (p[2] or 0) > p[1] or (p[7] or 0) > p[6]}
    assert sum(a["status"] == 200 for a in answers) >= 6, answers
    assert all(a["status"] in (200, 402) for a in answers), answers
    # committed is the truth: the upstream's own record, nothing left as liability
    assert committed == upstream_usd
    assert all((p[3] or 0) == 0 for p in settled)
    # the count was wrong enough that turns billed above their bounds...
    assert excess, "no permit billed above its bound: the under-count did not bite"
    # ...and the team passed its limit by at most the excess of the requests in flight
    # at its last admission (docs/bounds.md), at most one per replica here
    audit = [json.loads(line) for f in tmp_path.glob("gw*/audit-*.jsonl")
             for line in f.read_text().splitlines() if line.strip()]
    at = {(a["permit"], a["event"]): a["ts"] for a in audit if a.get("permit")}
    last = max(ts for (_, event), ts in at.items() if event == "admitted")
    in_flight = {p for p in excess if at[(p, "settled")] >= last}
    overshoot = max(0, committed - LIMIT)
    assert len(in_flight) <= REPLICAS
    assert overshoot <= sum(excess[p] for p in in_flight)
    # each permit above its bound (µUSD or tokens) flagged: the request log, the metric
    # on the replicas, the audit lines, the log
    assert set(excess) <= above
    assert {p[0] for p in settled if p[4]} == above
    assert flagged_metric == len(above)
    assert {a["permit"] for a in audit if a.get("bound_exceeded")} == above
    logs = "".join(g.logs() for g in gateways)
    assert logs.count("bound_exceeded: permit") == len(above)
    assert "Raise models[claude-opus-4-8].count_allowance_pct" in logs
    # the excess of each is at most its uncounted input at the dearest input class
    dearest = max(price.per_class(c) for c in CLASSES_5M)
    for a in audit:
        if a.get("permit") in excess and a.get("event") == "settled":
            usage = Usage(**a["usage"])
            unbounded = usage.total_tokens() - usage.output - _input_bound(a, price)
            assert 0 < excess[a["permit"]] <= -(-unbounded * dearest // 10**6)
    print(f"\nundercount {PERCENT}%: committed {committed} of {LIMIT} µUSD "
          f"(overshoot {overshoot}); {len(above)} permits flagged, µUSD excess "
          f"{sorted(excess.values())}, in flight at the last admission "
          f"{sorted(excess[p] for p in in_flight)}; answers "
          f"{[a['status'] for a in answers]}")


def _input_bound(line: dict[str, Any], price: ModelPrice) -> int:
    """The input tokens a permit was bounded by, from its token and µUSD bounds (the
    µUSD bound prices the input at the 5m-write class, the output at output)."""
    tokens, usd = int(line["token_bound"]), int(line["usd_bound"])
    per_in, per_out = price.cache_write_5m, price.output
    guess = (tokens * per_out - usd * 10**6) // (per_out - per_in)
    for n in range(max(0, guess - 3), guess + 4):
        if cost_bound_micro_usd(n, tokens - n, price, input_classes=CLASSES_5M) == usd:
            return n
    raise AssertionError(f"no input bound gives {line}")
