"""Identical-request dedupe on real processes: ten identical concurrent non-streamed
requests of one team make one upstream call, get ten answers and are charged once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e._routing import Routed, start_routed
from tests.e2e.conftest import expected_cost

N = 10
BODY = {"model": "claude-dd", "max_tokens": 64,
        "messages": [{"role": "user", "content": "the same question, ten times"}]}


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routed]:
    # slow-start: the upstream answers after 2 s, so all ten are in flight together.
    stack = start_routed(tmp_path_factory.mktemp("routing-dedupe"), {"up": "anthropic"}, [
        {"name": "claude-dd", "routing": {"strategy": "ordered", "dedupe": True},
         "deployments": [{"provider": "up", "upstream_model": "mock-claude-slow-start"}]}],
        prompt_cache=False)
    try:
        yield stack
    finally:
        stack.stop()


def _ten(routed: Routed, key: str, body: dict[str, object]) -> list[httpx.Response]:
    start = threading.Barrier(N)

    def one(_: int) -> httpx.Response:
        start.wait()
        return httpx.post(f"{routed.gateway.url}/v1/messages", json=body, timeout=60,
                          headers={"x-api-key": key, "anthropic-version": "2023-06-01"})
    with ThreadPoolExecutor(N) as pool:
        return list(pool.map(one, range(N)))


def test_ten_identical_requests_make_one_upstream_call_and_are_charged_once(
        routed: Routed) -> None:
    """One ledger entry upstream, ten identical answers, one of them charged its price
    and nine settled at zero naming the one that answered them."""
    key = routed.key("dedupe")
    routed.clear()
    answers = _ten(routed, key, BODY)
    ledger = routed.ledger("up")
    assert [r.status_code for r in answers] == [200] * N
    assert len(ledger) == 1
    assert len({r.json()["content"][0]["text"] for r in answers}) == 1
    costs = sorted(int(r.headers["x-inferplane-cost-micro-usd"]) for r in answers)
    assert costs == [0] * (N - 1) + [expected_cost(ledger[0])]
    leader = next(r.headers["x-inferplane-request-id"] for r in answers
                  if "x-inferplane-deduplicated" not in r.headers)
    assert sorted(r.headers.get("x-inferplane-deduplicated", "") for r in answers) == \
        [""] + [leader] * (N - 1)
    usage = httpx.get(f"{routed.gateway.url}/v1/usage",
                      headers={"Authorization": f"Bearer {key}"}).json()["data"]
    day = next(u for u in usage if (u["scope"], u["window"]) == ("team", "day"))
    assert (day["requests"], day["usd_committed"]) == (N, expected_cost(ledger[0]))


def test_identical_streams_are_never_shared(routed: Routed) -> None:
    """Ten identical streamed requests each go upstream."""
    key = routed.key("distinct")
    routed.clear()
    streams = _ten(routed, key, {**BODY, "stream": True})
    assert [r.status_code for r in streams] == [200] * N
    assert len(routed.ledger("up")) == N
