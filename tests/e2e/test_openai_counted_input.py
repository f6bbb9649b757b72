"""OpenAI models counted with OpenAI's encoding (the tokenize extra), with real processes
and the real openai SDK: the Responses bound is counted in tokens, and a Responses
stream cut after content commits its exactly counted input (docs/bounds.md)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.ingress._bounds import INLINE_BYTES
from gateway.ingress._tokenize import STRING_ALLOWANCE, encoding
from gateway.mock._model import openai_classes
from gateway.pricing import ModelPrice, Usage, cost_bound_micro_usd, cost_micro_usd
from tests.e2e._procs import serving, settled_line
from tests.e2e.conftest import PRICE, Stack

pytestmark = pytest.mark.e2e

# Aliases of the catalog's gpt-5 (the operator's word that they are that model), sent
# upstream under names that carry the mock's switch and the family's name, so OpenAI's
# table (tiktoken.model) names o200k_base for the model and its deployment alike.
MODELS = {"gpt-5-counted-cut": "gpt-5-mock-cut-stream", "gpt-5-counted": "gpt-5-mock",
          "gpt-5-counted-slow": "gpt-5-mock-slow-stream"}
# Plain prose (~4.8 bytes a token): the mock bills a token per 4 bytes of prompt text,
# which stays between the counted floor and the counted bound for such text.
INSTRUCTIONS = " ".join(f"Step {i}: when the repository changes, read the failing test first, "
                        "then explain the cause before proposing a patch." for i in range(130))
QUESTION = "Why does the build fail on the second run? " * 20


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with serving(tmp_path_factory.mktemp("counted"), lambda upstream: {
        "providers": [{"name": "up", "kind": "openai", "base_url": f"{upstream.url}/v1"}],
        "models": [{"name": name, "catalog": "gpt-5", "price": PRICE, "max_output_tokens": 4096,
                    "deployments": [{"provider": "up", "upstream_model": up}]}
                   for name, up in MODELS.items()]}) as (gateway, upstream, config):
        yield Stack(gateway=gateway, upstream=upstream, config=config)


def _settled_line(stack: Stack, model: str) -> dict[str, Any]:
    return settled_line(stack.config.parent / "data", model=model)


def _exact(*texts: str) -> int:
    enc = encoding("o200k_base")
    assert enc is not None
    return sum(len(enc.encode_ordinary(t)) for t in texts)


def test_a_cut_responses_stream_commits_its_exactly_counted_input(counted: Stack) -> None:
    """A Responses stream the upstream breaks after its first text delta (no usage ever
    reported): the openai SDK raises, and the settlement commits the exactly counted
    instructions and input (less the per-string allowance) plus the relayed output, with
    committed ≤ what the upstream billed ≤ committed + liability."""
    key = counted.team_key("counted-cut", "--usd-micros-per-day", "100000000")
    oa = openai.OpenAI(base_url=f"{counted.gateway.url}/v1", api_key=key, max_retries=0)
    with pytest.raises(openai.APIError, match="stream cut"):
        for _ in oa.responses.create(model="gpt-5-counted-cut", instructions=INSTRUCTIONS,
                                     input=QUESTION, max_output_tokens=50, stream=True):
            pass
    line = _settled_line(counted, "gpt-5-counted-cut")
    assert line["outcome"] == "uncertain" and "stream cut" in line["detail"]
    floor = _exact(INSTRUCTIONS) + _exact(QUESTION) - 4 * STRING_ALLOWANCE
    assert floor > 3000
    assert line["usage"]["cache_read"] == floor  # the input, at its cheapest class
    assert line["tokens_committed"] >= floor + 1  # and at least one relayed output token
    assert line["usd_committed"] >= cost_micro_usd(Usage(cache_read=floor),
                                                   ModelPrice(**PRICE))
    # A cut stream leaves no ledger entry: what the mock bills for the whole answer (a
    # pure function of the body) is the most the cut one can have cost.
    truth = Usage(**openai_classes({
        "model": MODELS["gpt-5-counted-cut"], "instructions": INSTRUCTIONS,
        "input": QUESTION, "max_output_tokens": 50, "stream": True}).as_dict())
    tokens = truth.total_tokens()
    usd = cost_micro_usd(truth, ModelPrice(**PRICE))
    assert line["tokens_committed"] <= tokens <= (line["tokens_committed"]
                                                  + line["tokens_liability"])
    assert line["usd_committed"] <= usd <= line["usd_committed"] + line["usd_liability"]


def test_a_responses_stream_the_client_leaves_commits_its_exactly_counted_input(
        counted: Stack) -> None:
    """An interrupted turn: the client closes a Responses stream after two text deltas (as
    Codex does on Ctrl-C); the settlement commits the exactly counted input plus the
    relayed output, and the rest of the bound is liability."""
    key = counted.team_key("counted-left", "--usd-micros-per-day", "100000000")
    oa = openai.OpenAI(base_url=f"{counted.gateway.url}/v1", api_key=key, max_retries=0)
    stream = oa.responses.create(model="gpt-5-counted-slow", instructions=INSTRUCTIONS,
                                 input=QUESTION, max_output_tokens=50, stream=True)
    kinds = []
    for event in stream:
        kinds.append(event.type)
        if kinds.count("response.output_text.delta") == 2:
            break
    stream.close()
    assert kinds[0] == "response.created" and kinds[-1] == "response.output_text.delta"
    line = _settled_line(counted, "gpt-5-counted-slow")
    assert line["outcome"] == "uncertain" and "client" in line["detail"]
    floor = _exact(INSTRUCTIONS) + _exact(QUESTION) - 4 * STRING_ALLOWANCE
    assert line["usage"]["cache_read"] == floor
    assert floor + 2 <= line["tokens_committed"]
    truth = Usage(**openai_classes({
        "model": MODELS["gpt-5-counted-slow"], "instructions": INSTRUCTIONS,
        "input": QUESTION, "max_output_tokens": 50, "stream": True}).as_dict())
    assert line["usd_committed"] <= cost_micro_usd(truth, ModelPrice(**PRICE)) <= (
        line["usd_committed"] + line["usd_liability"])


def test_the_responses_bound_is_counted_in_tokens(counted: Stack) -> None:
    """The admitted bound of a Responses request to an OpenAI model is its counted input
    (well below one token per body byte) plus the output allowance, and the stream
    completes and commits exactly what the upstream reported."""
    key = counted.team_key("counted-bound", "--usd-micros-per-day", "100000000")
    oa = openai.OpenAI(base_url=f"{counted.gateway.url}/v1", api_key=key, max_retries=0)
    counted.clear_ledger()
    raw = oa.responses.with_raw_response.create(
        model="gpt-5-counted", instructions=INSTRUCTIONS, input=QUESTION,
        max_output_tokens=50)
    response = raw.parse()
    assert response.status == "completed" and response.usage is not None
    body_bytes = len(raw.http_response.request.content)
    line = _settled_line(counted, "gpt-5-counted")
    by_bytes = cost_bound_micro_usd(body_bytes + 1024, 50, ModelPrice(**PRICE),
                                    input_classes=frozenset(("input", "cache_read")))
    assert line["usd_bound"] < by_bytes * 0.6, (line["usd_bound"], by_bytes)
    assert line["token_bound"] >= _exact(INSTRUCTIONS, QUESTION) + 50
    assert line["outcome"] == "complete" and not line["bound_exceeded"]
    assert line["tokens_committed"] == response.usage.total_tokens
    # Above INLINE_BYTES the count ran in a worker thread, as /metrics says.
    assert body_bytes > INLINE_BYTES
    metrics = httpx.get(f"{counted.gateway.url}/metrics").text
    assert re.search(r'^mayu_input_refinements_total\{outcome="tokenized",provider="up"\} '
                     r"[1-9]", metrics, re.MULTILINE), metrics
