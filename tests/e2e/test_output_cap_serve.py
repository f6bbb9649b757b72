"""Output limits the gateway writes, with real processes: the operator's opt-in output
cap (``default_output_tokens``), and budget fit's limit for a request with several
choices. A ``mayu serve`` in front of a ``mayu mock-upstream``, driven by the real openai
SDK; the upstream's ledger records the output limit each forwarded body carried, so the
tests see what left the gateway; /v1/usage shows what was reserved while a stream is
open."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gateway.pricing import ModelPrice, cost_bound_micro_usd
from tests.e2e._procs import serving, settled_line
from tests.e2e.conftest import PRICE, Stack

pytestmark = pytest.mark.e2e

CEILING = 128_000
OPENAI_CLASSES = frozenset(("input", "cache_read"))
OVERHEAD = 1024  # models[].input_overhead_tokens, the default


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    up = {"provider": "up", "upstream_model": "mock-gpt"}
    # Names outside the catalog: the input bound is the body's bytes + the overhead, so
    # the test computes the expected bound from the bytes the SDK sent.
    with serving(tmp_path_factory.mktemp("cap"), lambda upstream: {
        "server": {"max_output_tokens": 200_000},
        "providers": [{"name": "up", "kind": "openai", "base_url": f"{upstream.url}/v1"}],
        "models": [
            {"name": "cap-model", "price": PRICE, "max_output_tokens": CEILING,
             "default_output_tokens": 4096, "deployments": [up]},
            {"name": "cap-deployment", "price": PRICE, "max_output_tokens": CEILING,
             "default_output_tokens": 4096,
             "deployments": [{"provider": "up", "upstream_model": "mock-slow-stream",
                              "default_output_tokens": 16}]},
            {"name": "no-cap", "price": PRICE, "max_output_tokens": CEILING,
             "deployments": [up]}]}) as (gateway, upstream, config):
        yield Stack(gateway=gateway, upstream=upstream, config=config)


def _client(stack: Stack, team: str) -> tuple[openai.OpenAI, str]:
    key = stack.team_key(team, "--usd-micros-per-day", "100000000")
    return openai.OpenAI(base_url=f"{stack.gateway.url}/v1", api_key=key,
                         max_retries=0), key


def _bound(body_bytes: int, output: int) -> int:
    return cost_bound_micro_usd(body_bytes + OVERHEAD, output, ModelPrice(**PRICE),
                                input_classes=OPENAI_CLASSES)


def _settled(stack: Stack, model: str) -> dict[str, Any]:
    return settled_line(stack.config.parent / "data", model=model)


def test_a_responses_request_without_a_limit_is_forwarded_and_bounded_with_the_cap(
        capped: Stack) -> None:
    """A Responses request naming no max_output_tokens (as Codex sends them) leaves with
    the model's cap written in, is bounded and reserved by it (not the 128K ceiling),
    says so in x-inferplane-output-cap, and settles exactly within that bound."""
    oa, _ = _client(capped, "cap-json")
    capped.clear_ledger()
    raw = oa.responses.with_raw_response.create(model="cap-model", input="why? " * 50)
    response = raw.parse()
    assert response.status == "completed"
    sent = len(raw.http_response.request.content)
    assert raw.headers["x-inferplane-output-cap"] == "4096"
    assert int(raw.headers["x-inferplane-token-bound"]) == sent + OVERHEAD + 4096
    assert int(raw.headers["x-inferplane-usd-bound"]) == _bound(sent, 4096)
    assert _bound(sent, 4096) < _bound(sent, CEILING) / 20
    [entry] = capped.ledger()
    assert entry["output_limit"] == {"max_output_tokens": 4096}
    admitted = [a for a in capped.audit() if a.get("event") == "admitted"
                and a.get("model") == "cap-model"][-1]
    assert admitted["output_cap"] == 4096 and admitted["usd_bound"] == _bound(sent, 4096)
    line = _settled(capped, "cap-model")
    assert line["outcome"] == "complete" and not line["bound_exceeded"]


def test_a_stream_reserves_the_deployments_capped_bound_and_announces_it(
        capped: Stack) -> None:
    """A streamed Responses request to a deployment whose own cap (16) overrides the
    model's (4096): the stream's head carries the header, the team's reservation while
    it is open is the bound at 16 output tokens, and the upstream stops at 16."""
    oa, key = _client(capped, "cap-stream")
    capped.clear_ledger()
    raw = oa.responses.with_raw_response.create(model="cap-deployment",
                                                input="go on " * 60, stream=True)
    sent = len(raw.http_response.request.content)
    assert raw.headers["x-inferplane-output-cap"] == "16"
    assert int(raw.headers["x-inferplane-usd-bound"]) == _bound(sent, 16)
    events = iter(raw.parse())
    assert next(events).type == "response.created"
    reserved = capped.team_usage(key)["usd_reserved"]
    kinds = [e.type for e in events]
    assert reserved == _bound(sent, 16)
    assert kinds[-1] == "response.completed"
    [entry] = capped.ledger()
    assert entry["output_limit"] == {"max_output_tokens": 16}
    assert entry["classes"]["output"] == 16  # the mock wanted 40: stopped at the cap
    line = _settled(capped, "cap-deployment")
    assert line["outcome"] == "complete" and not line["bound_exceeded"]
    assert capped.team_usage(key)["usd_reserved"] == 0


def test_a_client_limit_is_kept_and_no_cap_is_announced(capped: Stack) -> None:
    """Chat completions: a client's max_tokens below the cap, and a max_completion_tokens
    above it, are forwarded as sent and bound the request; without a limit the cap goes
    as max_completion_tokens; a model without the setting forwards the body unchanged."""
    oa, _ = _client(capped, "cap-chat")
    messages: Any = [{"role": "user", "content": "hello"}]
    cases: list[tuple[str, dict[str, int], dict[str, int], int, str | None]] = [
        ("cap-model", {"max_tokens": 10}, {"max_tokens": 10}, 10, None),
        ("cap-model", {"max_completion_tokens": 9000}, {"max_completion_tokens": 9000},
         9000, None),
        ("cap-model", {}, {"max_completion_tokens": 4096}, 4096, "4096"),
        ("no-cap", {}, {}, CEILING, None),
    ]
    for model, limit, forwarded, output, header in cases:
        capped.clear_ledger()
        raw = oa.chat.completions.with_raw_response.create(
            model=model, messages=messages, **limit)  # type: ignore[arg-type]
        raw.parse()
        sent = len(raw.http_response.request.content)
        assert raw.headers.get("x-inferplane-output-cap") == header, (model, limit)
        assert int(raw.headers["x-inferplane-token-bound"]) == sent + OVERHEAD + output
        [entry] = capped.ledger()
        assert entry["output_limit"] == forwarded, (model, limit)


def test_budget_fit_splits_the_allowance_between_choices(capped: Stack) -> None:
    """A chat request with n=4 on a team whose budget cannot hold its worst case, with
    budget fit: the limit forwarded is per choice, so the four choices together stay
    within the output bound admitted (not four times it), and the header says so."""
    key = capped.team_key("fit-choices", "--usd-micros-per-day", "200000",
                          "--budget-fit-floor", "16")
    oa = openai.OpenAI(base_url=f"{capped.gateway.url}/v1", api_key=key, max_retries=0)
    capped.clear_ledger()
    raw = oa.chat.completions.with_raw_response.create(
        model="no-cap", n=4, max_tokens=100_000,
        messages=[{"role": "user", "content": "hello"}])
    raw.parse()
    sent = len(raw.http_response.request.content)
    fitted = raw.headers["x-inferplane-budget-fit"]
    assert fitted.startswith("max_tokens lowered from 100000 to ") and "(n=4)" in fitted
    [entry] = capped.ledger()
    per_choice = entry["output_limit"]["max_tokens"]
    assert 16 <= per_choice < 100_000
    output_bound = int(raw.headers["x-inferplane-token-bound"]) - (sent + OVERHEAD)
    assert output_bound == 4 * per_choice
    assert int(raw.headers["x-inferplane-usd-bound"]) == _bound(sent, 4 * per_choice)
    assert _bound(sent, 4 * per_choice) <= 200_000 < _bound(sent, 4 * (per_choice + 1))


def test_a_refusal_carries_the_cap_it_was_bounded_with(capped: Stack) -> None:
    """A request refused for money says in x-inferplane-output-cap which cap its bound
    used, and its message gives that output allowance, not the model's ceiling."""
    key = capped.team_key("cap-refused", "--usd-micros-per-day", "1000")
    oa = openai.OpenAI(base_url=f"{capped.gateway.url}/v1", api_key=key, max_retries=0)
    capped.clear_ledger()
    with pytest.raises(openai.APIStatusError) as refused:
        oa.responses.create(model="cap-model", input="hello")
    assert refused.value.status_code == 402
    assert refused.value.response.headers["x-inferplane-output-cap"] == "4096"
    # A Responses request names its output allowance by the field it would set.
    assert "max_output_tokens 4096" in refused.value.message, refused.value.message
    assert capped.ledger() == []
