"""Rate-limit headers feed routing, on real processes: a deployment whose answer says a
limit has nothing left (Anthropic's ``anthropic-ratelimit-requests-remaining: 0`` with its
reset time) gets no new request first until that reset; its answer still reaches the
client; a 429 with rate-limit headers but no ``retry-after`` cools it until the reset."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.e2e._routing import Routed, start_routed

MODEL = "claude-rl"
BODY = {"model": MODEL, "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routed]:
    stack = start_routed(tmp_path_factory.mktemp("routing-ratelimit"),
                         {"first": "anthropic", "second": "anthropic"}, [
        {"name": MODEL, "routing": {"strategy": "ordered", "cooldown_s": 1},
         "deployments": [{"provider": "first", "upstream_model": "mock-claude"},
                         {"provider": "second", "upstream_model": "mock-claude"}]}],
        prompt_cache=False)
    try:
        yield stack
    finally:
        stack.stop()


def _headers(routed: Routed, provider: str, values: dict[str, str] | None) -> None:
    url = f"{routed.upstreams[provider].url}/__mock/headers"
    (httpx.post(url, json=values) if values else httpx.delete(url)).raise_for_status()


def _send(routed: Routed, key: str, n: int) -> list[int]:
    statuses = []
    for _ in range(n):
        r = httpx.post(f"{routed.gateway.url}/v1/messages", json=BODY, timeout=60,
                       headers={"x-api-key": key, "anthropic-version": "2023-06-01"})
        statuses.append(r.status_code)
    return statuses


def _counts(routed: Routed) -> tuple[int, int]:
    return len(routed.ledger("first")), len(routed.ledger("second"))


def test_no_headroom_sends_new_requests_elsewhere_until_the_reset(routed: Routed) -> None:
    """``first`` answers with requests-remaining 0 and a reset 8 s ahead: that answer is
    relayed, the next five go to ``second``; after the reset ``first`` is first again."""
    key = routed.key("headroom")
    routed.clear()
    reset = datetime.now(UTC) + timedelta(seconds=8)
    _headers(routed, "first", {"anthropic-ratelimit-requests-remaining": "0",
                               "anthropic-ratelimit-requests-reset": reset.isoformat()})
    try:
        assert _send(routed, key, 1) == [200]
        assert _counts(routed) == (1, 0)
        assert _send(routed, key, 5) == [200] * 5
        assert _counts(routed) == (1, 5)
    finally:
        _headers(routed, "first", None)
    time.sleep(max(0.0, (reset - datetime.now(UTC)).total_seconds()) + 0.5)
    assert _send(routed, key, 2) == [200] * 2
    assert _counts(routed) == (3, 5)


def test_a_429_without_retry_after_cools_until_the_ratelimit_reset(routed: Routed) -> None:
    """A 429 carrying OpenAI-style ``x-ratelimit-reset-requests: 6s`` (no ``retry-after``)
    with cooldown_s 1: the deployment is left out for the 6 s, not 1 s."""
    key = routed.key("reset")
    time.sleep(0.5)  # the previous test's state is settled
    routed.clear()
    routed.fail("first", 429)
    _headers(routed, "first", {"x-ratelimit-remaining-requests": "0",
                               "x-ratelimit-reset-requests": "6s"})
    failed_at = time.monotonic()
    try:
        assert _send(routed, key, 1) == [200]  # 429 from first, answered by second
        assert _counts(routed) == (0, 1)
    finally:
        routed.heal("first")
        _headers(routed, "first", None)
    time.sleep(max(0.0, failed_at + 2.5 - time.monotonic()))  # past cooldown_s
    assert _send(routed, key, 1) == [200]
    assert _counts(routed) == (0, 2)  # first is still left out
    time.sleep(max(0.0, failed_at + 8.5 - time.monotonic()))  # 6 s after the 429 + margin
    assert _send(routed, key, 1) == [200]
    assert _counts(routed) == (1, 2)  # back after the reset
