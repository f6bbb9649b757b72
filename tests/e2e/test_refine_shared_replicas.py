"""The $1/day Opus budget through 3 shared replicas (issue 26), with real processes.

Three ``mayu serve`` replicas of the shared profile on one fresh migrated Postgres
database, each with its own count cache, in front of one ``mayu mock-upstream``; the
``anthropic`` SDK replays the Claude Code session (tests/bench/agent_budget.py) turn by
turn round-robin over them. ~15 s (three gateways to start, ~8 turns).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gateway.catalog import builtin_catalog
from gateway.pricing import cost_bound_micro_usd
from tests.bench.agent_budget import MODEL, config_file, session
from tests.e2e._procs import Proc, run_cli, start_gateway, start_mock_upstream

pytestmark = pytest.mark.e2e

LIMIT, FLOOR = 1_000_000, 1024


def _shared(dsn: str) -> dict[str, object]:
    return {"key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
            "database": {"dsn_ref": "env:INFERPLANE_DATABASE_URL", "pool_min_size": 1,
                         "pool_max_size": 4}}


def test_three_shared_replicas_spend_a_dollar_a_day_as_one_gateway_does(
        tmp_path: Path, pg_dsn: str) -> None:
    """Turns spread over three replicas: each admitted on a counted bound (each replica
    counts for itself), committed equals the upstream's record and stays within the
    limit, and the final refusal is the counted bound's, as with one gateway."""
    env = {"INFERPLANE_DATABASE_URL": pg_dsn}
    upstream = start_mock_upstream(tmp_path)
    gateways: list[Proc] = []
    try:
        configs = [config_file(tmp_path, upstream, None, shared=_shared(pg_dsn),
                               name=f"gw{i}") for i in range(3)]
        for config in configs:
            gateways.append(start_gateway(config, env=env))
        team = run_cli("teams", "create", "small", "--config", str(configs[0]), "--json",
                       "--usd-micros-per-day", str(LIMIT), "--budget-fit-floor", str(FLOOR),
                       env=env)
        assert team.returncode == 0, team.stderr
        made = run_cli("keys", "create", "--team", "small", "--config", str(configs[0]),
                       "--json", env=env)
        assert made.returncode == 0, made.stderr
        result = session(gateways, upstream, json.loads(made.stdout)["key"], limit=LIMIT)
    finally:
        for proc in gateways:
            proc.stop()
        upstream.stop()
    admitted = [a for a in result["answers"] if a["status"] == 200]
    assert len(admitted) >= 6
    assert all(a["input_bound"] in ("counted", "counted-prefix") for a in admitted)
    assert result["usd_committed"] == result["upstream_usd"]
    assert result["usd_liability"] == result["usd_reserved"] == 0
    assert 0.75 * LIMIT <= result["usd_committed"] <= LIMIT
    counted = re.search(r"up to (\d+) input tokens \(counted by the provider",
                        result["refusal"] or "")
    assert counted is not None, result["refusal"]
    entry = builtin_catalog().get(MODEL)
    assert entry is not None
    at_floor = cost_bound_micro_usd(int(counted.group(1)), FLOOR, entry.price,
                                    input_classes=frozenset(("input", "cache_read",
                                                             "cache_write_5m")))
    assert LIMIT - result["usd_committed"] < at_floor
    # the final 402 says what one more turn needs at the least: its input's price (issue 33)
    need = re.search(r"One more request like this one needs at least (\d+) µUSD",
                     result["refusal"] or "")
    assert need is not None, result["refusal"]
    assert int(need.group(1)) == cost_bound_micro_usd(
        int(counted.group(1)), 1, entry.price,
        input_classes=frozenset(("input", "cache_read", "cache_write_5m")))
