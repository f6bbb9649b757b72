"""Small budgets at Opus prices keep an agent working (issue 26), with real processes.

``mayu serve`` in front of ``mayu mock-upstream`` (an ``anthropic`` provider, so the
input bound is refined with the upstream's own ``/v1/messages/count_tokens``), the real
``anthropic`` SDK replaying a Claude Code session (tests/bench/agent_budget.py).
Each test starts its own two processes and runs 8–16 turns: ~10–20 s.
"""

from __future__ import annotations

import re
from pathlib import Path

import anthropic
import pytest

from gateway.catalog import builtin_catalog
from gateway.pricing import cost_bound_micro_usd
from tests.bench.agent_budget import MODEL, UNCOUNTED, config_file, run, turn
from tests.e2e._procs import create_key, create_team, start_gateway, start_mock_upstream

pytestmark = pytest.mark.e2e

FLOOR = 1024


def _floor_bound(input_tokens: int) -> int:
    """The µUSD bound of a marked (5m) Opus request with that input at the floor."""
    entry = builtin_catalog().get(MODEL)
    assert entry is not None
    return cost_bound_micro_usd(input_tokens, FLOOR, entry.price,
                                input_classes=frozenset(
                                    ("input", "cache_read", "cache_write_5m")))


def test_a_dollar_a_day_at_opus_prices_spends_until_one_counted_turn_no_longer_fits(
        ) -> None:
    """$1/day, budget fit floor 1024: every turn is admitted with a counted input bound
    until what remains is below one turn's counted bound at the floor; committed equals
    the upstream's own record, is never above the limit, nothing is left as liability.
    (At HEAD before issue 26: 3 turns and 32.8 % with the byte bound.)"""
    limit = 1_000_000
    result = run(limit=limit, floor=FLOOR)
    admitted = [a for a in result["answers"] if a["status"] == 200]
    assert len(admitted) >= 6
    assert all(a["input_bound"] in ("counted", "counted-prefix") for a in admitted)
    assert result["usd_committed"] == result["upstream_usd"]
    assert result["usd_liability"] == result["usd_reserved"] == 0
    held = result["usd_committed"]
    assert 0.75 * limit <= held <= limit
    # The refusal is the counted bound's: it says so, and it was right to refuse.
    refusal = result["refusal"]
    assert refusal is not None and refusal.startswith("402")
    counted = re.search(r"up to (\d+) input tokens \(counted by the provider", refusal)
    assert counted is not None, refusal
    assert limit - held < _floor_bound(int(counted.group(1)))
    assert result["count_calls"] <= len(result["answers"]) + 1
    # Each admission and the refusal say in the audit which bound they used.
    assert result["audit_bases"] == ["counted"] * (len(admitted) + 1)


def test_after_two_interrupted_turns_a_five_dollar_team_is_still_admitted() -> None:
    """$5/day, two Claude Code turns interrupted after their first text event: the next
    turns are admitted (their input bound counted) and nothing held exceeds the limit."""
    limit = 5_000_000
    result = run(limit=limit, floor=FLOOR, interrupt=2)
    assert result["admitted"] >= 1
    assert result["answers"][0]["status"] == 200
    held = result["usd_committed"] + result["usd_liability"] + result["usd_reserved"]
    assert held <= limit


def test_a_failed_count_leaves_the_byte_bound_and_the_refusal_says_so(
        tmp_path: Path) -> None:
    """An upstream whose count_tokens fails: the refusal is the byte bound's, says so in
    its message and in x-inferplane-input-bound; the upstream was never sent the turn."""
    upstream = start_mock_upstream(tmp_path)
    try:
        gateway = start_gateway(config_file(tmp_path, upstream, None))
        try:
            config = tmp_path / "mayu.yaml"
            create_team(config, "tiny", "--usd-micros-per-day", "300000")
            client = anthropic.Anthropic(base_url=gateway.url, max_retries=0, timeout=30,
                                         api_key=create_key(config, "tiny"))
            with pytest.raises(anthropic.APIStatusError) as refused:
                client.messages.create(**turn(0, model=UNCOUNTED))
            assert refused.value.status_code == 402
            assert refused.value.response.headers["x-inferplane-input-bound"] == \
                "byte-count-failed"
            assert ("(bounded by the body's bytes: the provider's token count failed)"
                    in refused.value.message), refused.value.message
            counted = client.messages.with_raw_response.create(**{
                **turn(0), "max_tokens": 4000})  # the counting model: admitted
            assert counted.headers["x-inferplane-input-bound"] == "counted"
        finally:
            gateway.stop()
        assert "input bound not refined" in gateway.logs()
    finally:
        upstream.stop()
