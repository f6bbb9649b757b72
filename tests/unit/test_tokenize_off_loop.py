"""OpenAI input counts off the event loop (gateway.ingress._bounds.off_loop, issue 26): a
body above ``INLINE_BYTES`` is left at its byte bound by ``input_bound`` and counted in a
worker thread by the attempt, to the same bound the inline count gives."""

from __future__ import annotations

import asyncio
import random
import threading
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import Deployment, ModelSettings, Settings
from gateway.governance import Bounds
from gateway.ingress import _bounds
from gateway.ingress._attempt import Attempt, Call
from gateway.ingress._bounds import INLINE_BYTES, counts_off_loop, input_bound, off_loop
from gateway.ingress._tokenize import _token_counts, encoding
from gateway.metrics import Metrics
from gateway.pricing import ModelPrice, cost_bound_micro_usd
from tests.bench.bounds import codex

O200K = encoding("o200k_base")
pytestmark = pytest.mark.skipif(O200K is None, reason="needs the tokenize extra")
PRICE = ModelPrice(input=1_250_000, output=10_000_000, cache_read=125_000)
GPT = ModelSettings(name="gpt-5.1-codex", deployments=[Deployment(provider="up")],
                    price=PRICE, max_output_tokens=128_000)
CLAUDE = ModelSettings(name="claude-sonnet-4-6", deployments=[Deployment(provider="up")])


def _codex() -> tuple[bytes, dict[str, Any]]:
    doc = {**codex(random.Random(3))[1], "model": GPT.name}
    return msgspec.json.encode(doc), doc


def test_a_large_body_is_counted_in_a_worker_thread_to_the_inline_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Codex-sized body: input_bound gives the byte bound at once; off_loop counts it on
    another thread than the event loop's, to exactly what counting it inline gives."""
    body, doc = _codex()
    assert len(body) > INLINE_BYTES and counts_off_loop(body, doc, GPT)
    by_bytes = len(body) + GPT.input_overhead_tokens
    assert input_bound(body, doc, GPT) == by_bytes
    inline = input_bound(body, doc, GPT, inline_bytes=None)
    assert inline < by_bytes / 3
    threads: list[threading.Thread] = []
    count = _bounds.input_ceiling

    def recording(*args: Any) -> int | None:
        threads.append(threading.current_thread())
        return count(*args)

    monkeypatch.setattr(_bounds, "input_ceiling", recording)

    async def go() -> tuple[int | None, threading.Thread]:
        return await off_loop(body, doc, GPT, by_bytes), threading.current_thread()
    counted, loop_thread = asyncio.run(go())
    assert counted == inline
    assert len(threads) == 1 and threads[0] is not loop_thread


def test_small_bodies_other_models_and_provider_input_stay_where_they_were() -> None:
    """Nothing is left to the thread for a body within INLINE_BYTES (counted inline), a
    model without an OpenAI encoding, or a request with hosted tools (the window)."""
    small = {"model": GPT.name, "input": "hi"}
    assert not counts_off_loop(msgspec.json.encode(small), small, GPT)
    body, doc = _codex()
    assert not counts_off_loop(body, doc, CLAUDE)
    hosted = {**doc, "tools": [{"type": "web_search"}]}
    assert not counts_off_loop(msgspec.json.encode(hosted), hosted, GPT)
    assert asyncio.run(off_loop(msgspec.json.encode(small), small, GPT, 5)) is None


@given(st.lists(st.sampled_from(["type", "message", "role", "user", "", " ", "é€😀"])
                | st.text(max_size=60), max_size=40).map(lambda xs: xs + xs[:5]))
def test_token_counts_are_tiktokens_own(texts: list[str]) -> None:
    """The count loop (a repeated string encoded once) gives tiktoken's own counts."""
    assert O200K is not None
    assert _token_counts(O200K, texts) == [len(t) for t in
                                           O200K.encode_ordinary_batch(texts)]


def test_the_attempt_bounds_the_call_by_the_threaded_count_once() -> None:
    """The first attempt replaces the call's byte bound (and µUSD bound) by the threaded
    count, counts it as a ``tokenized`` refinement; a second attempt does not recount."""
    body, doc = _codex()
    by_bytes = input_bound(body, doc, GPT)
    classes = frozenset(("input", "cache_read"))
    metrics = Metrics()
    gw = SimpleNamespace(settings=Settings(), metrics=metrics)
    call = Call(gw=gw, principal=None, endpoint="responses",  # type: ignore[arg-type]
                model=GPT, doc=doc, body=body, stream=True, client_headers={},
                bounds=Bounds(input_tokens=by_bytes, output_tokens=4096, price=PRICE,
                              input_classes=classes), deployments=[])
    attempt = Attempt(call=call, deployment=GPT.deployments[0], provider=None,  # type: ignore[arg-type]
                      index=0)
    asyncio.run(attempt.bound())
    call = attempt.call
    counted = input_bound(body, doc, GPT, inline_bytes=None)
    assert call.bounds.input_tokens == call.bounds.byte_input == counted < by_bytes
    assert call.usd_bound == cost_bound_micro_usd(counted, 4096, PRICE, input_classes=classes)
    labels = {"provider": "up", "outcome": "tokenized"}
    sample = metrics.registry.get_sample_value
    assert sample("mayu_input_refinements_total", labels) == 1
    assert sample("mayu_input_refinement_seconds_count", labels) == 1
    asyncio.run(Attempt(call=call, deployment=GPT.deployments[0],
                        provider=None, index=1).bound())  # type: ignore[arg-type]
    assert sample("mayu_input_refinements_total", labels) == 1
