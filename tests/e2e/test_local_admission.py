"""Admission that lets coding agents work (issue 8), with real processes and real SDKs.

TPM is charged ADR-039's estimate (body length / 4) and trued up to the actual usage;
a refusal says what to do (worst case, the largest max_tokens that fits, the window
reset); budget fit lowers max_tokens for teams that opted in.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import Stack

pytestmark = pytest.mark.e2e

BIG = "x" * 108_000  # ~27k tokens by the mock's count, like one Claude Code turn


def _db(stack: Stack) -> sqlite3.Connection:
    conn = sqlite3.connect(stack.config.parent / "data" / "mayu.db")
    conn.row_factory = sqlite3.Row
    return conn


def test_tpm_reserves_the_estimate_so_agent_sized_prompts_run_concurrently(
        stack: Stack) -> None:
    """TPM 100k, ten concurrent 108 KB requests whose real usage is ~27k tokens: at least
    three are in flight at once (the estimate, not the worst case, is reserved), and each
    settlement trues the bucket up to the actual total."""
    key = stack.team_key("tpm-agents", "--tpm", "100000")
    stack.clear_ledger()
    statuses: list[int] = []

    def one() -> None:
        r = httpx.post(f"{stack.gateway.url}/v1/chat/completions", timeout=60,
                       headers={"Authorization": f"Bearer {key}"},
                       json={"model": "gpt-slow", "max_tokens": 40,
                             "messages": [{"role": "user", "content": BIG}]})
        statuses.append(r.status_code)

    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses.count(200) >= 3, statuses
    assert set(statuses) <= {200, 429}
    ledger = stack.ledger()
    assert len(ledger) == statuses.count(200)
    # /v1/usage before the file: it waits for the settlements still in flight.
    team_id = stack.usage(key)[("team", "day")]["id"]
    with _db(stack) as conn:
        rows = conn.execute(
            "SELECT g.amount, g.committed FROM gov_charges g JOIN gov_permits p"
            " ON p.id = g.permit_id WHERE g.counter = ? AND p.status = 'settled'",
            (f"team:{team_id}:tpm",)).fetchall()
    # Reserved the estimate (body / 4 ≈ 27k, far below the ~108k-token bound), trued up
    # to the actual total of every class the upstream reported.
    assert {r["amount"] for r in rows} and max(r["amount"] for r in rows) < 28_000
    assert sorted(r["committed"] for r in rows) == sorted(
        sum(e["classes"].values()) for e in ledger)


def test_an_under_estimate_leaves_the_bucket_in_debt(stack: Stack) -> None:
    """A request whose usage far exceeds its estimate (hidden input) debits the bucket
    below zero; the next request waits (429 with a Retry-After) until refill repays it."""
    key = stack.team_key("tpm-debt", "--tpm", "1000")
    r = httpx.post(f"{stack.gateway.url}/v1/chat/completions", timeout=60,
                   headers={"Authorization": f"Bearer {key}"},
                   json={"model": "gpt-hidden", "max_tokens": 5,
                         "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    # /v1/usage before the file: it waits for the settlements still in flight.
    team_id = stack.usage(key)[("team", "day")]["id"]
    with _db(stack) as conn:
        [balance] = conn.execute("SELECT balance FROM gov_counters WHERE counter = ?",
                                 (f"team:{team_id}:tpm",)).fetchone()
    assert balance < 0  # debt, no floor (ADR-039)
    again = httpx.post(f"{stack.gateway.url}/v1/chat/completions", timeout=60,
                       headers={"Authorization": f"Bearer {key}"},
                       json={"model": "gpt-up", "max_tokens": 5,
                             "messages": [{"role": "user", "content": "hi"}]})
    assert again.status_code == 429 and int(again.headers["retry-after"]) > 60


def _claude_code_turn(i: int) -> dict[str, Any]:
    return {"model": "claude-opus", "max_tokens": 32_000,
            "messages": [{"role": "user", "content": f"fix bug {i}: " + "y" * 4000}]}


def test_refusals_say_what_to_do_in_both_shapes(stack: Stack) -> None:
    """A $1/day team's first Claude-Code-sized request ($2.40 worst case, nothing spent)
    is refused with the figures and the largest max_tokens that fits; its own bound, not
    spend, is the cause, so it is a 400 invalid_request_error naming max_tokens (issue
    33), never a spent limit; once something is spent, a request that does not fit what
    remains is the spent window's 402 (insufficient_quota / billing_error), no Retry-After."""
    key = stack.team_key("explain", "--usd-micros-per-day", "1000000")
    an = anthropic.Anthropic(base_url=stack.gateway.url, api_key=key, max_retries=0,
                             timeout=60)
    with pytest.raises(anthropic.APIStatusError) as err:
        an.messages.create(**_claude_code_turn(0))
    assert err.value.status_code == 400
    body = err.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"
    message = body["error"]["message"]
    for words in ("limit 1000000 µUSD", "committed 0", "liability 0", "reserved 0",
                  "worst case", "Nothing is spent", "max_tokens <= "):
        assert words in message, message
    oa = openai.OpenAI(base_url=f"{stack.gateway.url}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.APIStatusError) as oerr:
        oa.chat.completions.create(model="gpt-opus", max_tokens=32_000,
                                   messages=[{"role": "user", "content": "hi"}])
    assert oerr.value.status_code == 400
    error = oerr.value.body
    assert isinstance(error, dict) and error["param"] == "max_tokens"
    assert "max_tokens <= " in error["message"]
    fits = int(message.split("max_tokens <= ")[1].split(":")[0].split()[0])
    ok = an.messages.create(**{**_claude_code_turn(1), "max_tokens": fits})
    assert ok.content  # the advice was right
    with pytest.raises(anthropic.APIStatusError) as spent:
        an.messages.create(**{**_claude_code_turn(2), "max_tokens": fits})
    assert spent.value.status_code == 402
    body = spent.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "billing_error"
    assert "window resets at" in body["error"]["message"]
    # A spent budget cannot clear before its window resets: no client should sleep on it.
    assert "retry-after" not in spent.value.response.headers
    assert spent.value.response.headers["x-should-retry"] == "false"


def test_budget_fit_lowers_max_tokens_and_spends_up_to_the_limit(stack: Stack) -> None:
    """A $1/day team that opted into budget fit: Claude-Code-sized requests are admitted
    with max_tokens lowered (and said so); the team spends until what remains is below
    one request's worst case at the floor; committed never exceeds the limit."""
    limit = 1_000_000
    key = stack.team_key("fit", "--usd-micros-per-day", str(limit),
                         "--budget-fit-floor", "1024")
    an = anthropic.Anthropic(base_url=stack.gateway.url, api_key=key, max_retries=0,
                             timeout=60)
    fitted, costs, refused = 0, [], None
    for i in range(400):
        try:
            raw = an.messages.with_raw_response.create(**_claude_code_turn(i))
        except anthropic.APIStatusError as exc:
            refused = exc
            break
        header = raw.headers.get("x-inferplane-budget-fit")
        if header:
            fitted += 1
            assert header.startswith("max_tokens lowered from 32000 to ")
        costs.append(int(raw.headers["x-inferplane-cost-micro-usd"]))
    assert refused is not None and refused.status_code == 402
    assert fitted == len(costs) > 1
    usage = stack.team_usage(key)
    assert usage["usd_committed"] == sum(costs) <= limit
    floor_worst = json.loads(json.dumps(refused.body))["error"]["message"]
    assert "No max_tokens fits now" in floor_worst or "max_tokens <= " in floor_worst
    # What is left cannot hold one more request at the floor (1024 output tokens at
    # $75/Mtok is 76,800 µUSD, plus its input bound).
    assert limit - usage["usd_committed"] < 76_800 + 400_000


def test_every_answer_carries_the_remaining_limit_headers_of_its_protocol(
        stack: Stack) -> None:
    """x-ratelimit-* for OpenAI clients, anthropic-ratelimit-* for Anthropic ones, from
    the tightest bucket admission charged; a rate refusal says 0 remain."""
    key = stack.team_key("headers", "--rpm", "2", "--tpm", "100000")
    oa = openai.OpenAI(base_url=f"{stack.gateway.url}/v1", api_key=key, max_retries=0)
    raw = oa.chat.completions.with_raw_response.create(
        model="gpt-up", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-ratelimit-limit-requests"] == "2"
    assert raw.headers["x-ratelimit-remaining-requests"] == "1"
    assert raw.headers["x-ratelimit-limit-tokens"] == "100000"
    assert 0 < int(raw.headers["x-ratelimit-remaining-tokens"]) < 100_000
    assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
    an = anthropic.Anthropic(base_url=stack.gateway.url, api_key=key, max_retries=0)
    araw = an.messages.with_raw_response.create(
        model="claude-up", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert araw.headers["anthropic-ratelimit-requests-limit"] == "2"
    assert araw.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert araw.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    with pytest.raises(anthropic.RateLimitError) as err:
        an.messages.create(model="claude-up", max_tokens=5,
                           messages=[{"role": "user", "content": "hi"}])
    headers = err.value.response.headers
    assert headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert int(headers["retry-after"]) >= 1
