"""Routing health on real processes: a deployment that starts failing mid-run is left out
within one cooldown, no client sees its failure while another deployment has room, it
comes back once it heals, and a stream is never retried after its first byte."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import anthropic
import pytest

from tests.e2e._routing import Routed, start_routed

COOLDOWN_S = 3.0
CONCURRENCY = 4
HI = {"max_tokens": 16, "messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routed]:
    workdir = tmp_path_factory.mktemp("routing-health")
    routing = {"strategy": "weighted", "cooldown_s": COOLDOWN_S,
               "max_cooldown_s": COOLDOWN_S}
    stack = start_routed(workdir, {"east": "anthropic", "west": "anthropic"}, [
        {"name": "claude-two", "routing": routing, "deployments": [
            {"provider": "east", "upstream_model": "mock-claude"},
            {"provider": "west", "upstream_model": "mock-claude"}]},
        {"name": "claude-cut-first", "routing": {**routing, "strategy": "ordered"},
         "deployments": [{"provider": "east", "upstream_model": "mock-cut-stream"},
                         {"provider": "west", "upstream_model": "mock-claude"}]},
    ], prompt_cache=False)
    try:
        yield stack
    finally:
        stack.stop()


def _client(routed: Routed, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=routed.gateway.url, api_key=key, max_retries=0,
                               timeout=60)


def _burst(client: anthropic.Anthropic, n: int) -> list[int]:
    """``n`` requests, ``CONCURRENCY`` at a time: each one's HTTP status."""
    def one(_: int) -> int:
        r = client.messages.with_raw_response.create(model="claude-two", **HI)  # type: ignore[call-overload]
        return int(r.status_code)
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        return list(pool.map(one, range(n)))


def test_a_failing_deployment_is_left_out_within_one_cooldown_and_comes_back(
        routed: Routed) -> None:
    """Both deployments share the load; once one answers 503 every client still gets its
    answer from the other, the failing one sees at most the requests already on their
    way plus one probe per cooldown, and after it heals it serves again."""
    client = _client(routed, routed.key("health"))
    routed.clear()
    assert _burst(client, 20) == [200] * 20
    assert len(routed.ledger("east")) > 0 and len(routed.ledger("west")) > 0

    routed.fail("east", 503, retry_after=1)
    start = time.monotonic()
    statuses = _burst(client, 60)
    elapsed = time.monotonic() - start
    assert statuses == [200] * 60  # nobody saw the failure: west had room
    failed = routed.counts("east")["failed"]
    assert 1 <= failed <= CONCURRENCY + math.ceil(elapsed / COOLDOWN_S), (failed, elapsed)

    routed.heal("east")
    before = len(routed.ledger("east"))
    deadline = time.monotonic() + 20 * COOLDOWN_S
    while len(routed.ledger("east")) == before:
        assert time.monotonic() < deadline, "the healed deployment never served again"
        assert _burst(client, CONCURRENCY) == [200] * CONCURRENCY
    assert _burst(client, 20) == [200] * 20
    assert len(routed.ledger("east")) >= before + 5  # balanced again, not a lone probe


def test_a_stream_cut_after_its_first_byte_is_never_retried(routed: Routed) -> None:
    """The first deployment cuts the stream after its first events: the client's SDK
    raises, the fallback deployment is never called for it, and the cut deployment is
    left out of the next request."""
    client = _client(routed, routed.key("cut"))
    routed.clear()
    with pytest.raises(anthropic.APIError), \
            client.messages.stream(model="claude-cut-first", **HI) as stream:  # type: ignore[arg-type]
        for _ in stream.text_stream:
            pass
    assert routed.ledger("west") == []
    assert routed.counts("west")["failed"] == 0
    # The cut counted against the first deployment's health: the next request, within
    # its cooldown, is answered by the other one.
    raw = client.messages.with_raw_response.create(  # type: ignore[call-overload]
        model="claude-cut-first", **HI)
    assert raw.status_code == 200 and len(routed.ledger("west")) == 1
