"""Retry semantics the real SDKs obey, at their default retry settings (issue 26).

A spent day window cannot clear before midnight: the SDKs must give up at once instead
of sleeping on a Retry-After of hours. A bucket refusal clears in seconds: the SDKs wait
its precise Retry-After and retry. A failed upstream is reported without the provider's
name or its transport error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import Stack

pytestmark = pytest.mark.e2e


def _raises_quickly(call: Callable[[], object]) -> tuple[Exception, float]:
    """The error ``call`` raised and how long it took; a call still running after 30 s
    (an SDK asleep on a Retry-After) fails the test instead of hanging it."""
    outcome: list[tuple[Exception, float]] = []

    def run() -> None:
        start = time.monotonic()
        try:
            call()
        except Exception as exc:  # the test inspects whatever the SDK raised
            outcome.append((exc, time.monotonic() - start))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert outcome, "the SDK neither answered nor raised within 30 s (sleeping on Retry-After?)"
    return outcome[0]


def test_anthropic_sdk_gives_up_at_once_on_a_spent_daily_token_quota(stack: Stack) -> None:
    """Anthropic SDK, default retries, spent daily token quota: raises within 2 s, told
    not to retry, with the quota's code and its reset in the headers."""
    key = stack.team_key("retry-tokens-anthropic", "--tokens-per-day", "1")
    client = anthropic.Anthropic(base_url=stack.gateway.url, api_key=key)
    err, took = _raises_quickly(lambda: client.messages.create(
        model="claude-up", max_tokens=5, messages=[{"role": "user", "content": "hi"}]))
    assert isinstance(err, anthropic.RateLimitError) and took < 2, (err, took)
    assert err.error_code == "token_quota_exhausted"
    headers = err.response.headers
    assert headers["x-should-retry"] == "false" and "retry-after" not in headers
    assert headers["anthropic-ratelimit-tokens-reset"].endswith("T00:00:00Z")
    assert "window resets at" in err.message


def test_openai_sdk_gives_up_at_once_on_a_spent_daily_quota_or_budget(stack: Stack) -> None:
    """OpenAI SDK, default retries: a spent daily token quota (429) and a spent daily
    budget (402) each raise within 2 s as insufficient_quota, told not to retry."""
    for team, limit, status in (("retry-tokens-openai", "--tokens-per-day", 429),
                                ("retry-usd-openai", "--usd-micros-per-day", 402)):
        key = stack.team_key(team, limit, "1")
        client = openai.OpenAI(base_url=f"{stack.gateway.url}/v1", api_key=key)
        err, took = _raises_quickly(partial(
            client.chat.completions.create, model="gpt-up", max_tokens=5,
            messages=[{"role": "user", "content": "hi"}]))
        assert isinstance(err, openai.APIStatusError) and took < 2, (err, took)
        assert err.status_code == status and err.code == "insufficient_quota"
        headers = err.response.headers
        assert headers["x-should-retry"] == "false" and "retry-after" not in headers
        assert headers["x-inferplane-window-reset"].endswith("T00:00:00Z")


def test_an_rpm_refusal_keeps_a_precise_retry_after_that_the_sdks_wait_out(
        stack: Stack) -> None:
    """RPM 12 spent: 429 with x-should-retry true and Retry-After <= 5 s; each SDK with
    its default retries waits it out and gets its answer on a retry."""
    key = stack.team_key("retry-rpm", "--rpm", "12")
    url = f"{stack.gateway.url}/v1/chat/completions"
    body = {"model": "gpt-local", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(40):
        r = httpx.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        if r.status_code != 200:
            break
    assert r.status_code == 429 and r.headers["x-should-retry"] == "true"
    assert 1 <= int(r.headers["retry-after"]) <= 5
    oa = openai.OpenAI(base_url=f"{stack.gateway.url}/v1", api_key=key)
    answer = oa.chat.completions.with_raw_response.create(
        model="gpt-local", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert answer.status_code == 200 and answer.retries_taken >= 1
    an = anthropic.Anthropic(base_url=stack.gateway.url, api_key=key)
    message = an.messages.with_raw_response.create(model="claude-local", max_tokens=4,
                                                   messages=[{"role": "user", "content": "hi"}])
    assert message.status_code == 200 and message.retries_taken >= 1


def test_a_failed_upstream_is_reported_without_its_internals(stack: Stack) -> None:
    """No upstream reachable: the 502 message names neither the provider nor the
    transport error, only the request id; the audit line keeps the detail."""
    key = stack.team_key("retry-upstream-down")
    client = openai.OpenAI(base_url=f"{stack.gateway.url}/v1", api_key=key)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="gpt-down", max_tokens=5,
                                       messages=[{"role": "user", "content": "hi"}])
    err = caught.value
    rid = err.response.headers["x-inferplane-request-id"]
    assert err.status_code == 502 and err.code == "upstream_unavailable"
    assert isinstance(err.body, dict)
    assert err.body["message"] == f"The upstream provider could not be reached (request {rid})."
    details = [str(line.get("detail")) for line in stack.audit()
               if line.get("request_id") == rid]
    assert any("Connect" in detail for detail in details), details
