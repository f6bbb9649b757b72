"""The input-bound refinement metrics on /metrics, with real processes: ``mayu serve`` in
front of ``mayu mock-upstream`` as an ``anthropic`` provider (whose count_tokens counts as
it bills), the real anthropic SDK. Each refinement step is counted by provider and outcome
and timed; an admission on the byte bound that could have counted is ``not_needed``."""

from __future__ import annotations

import re
from collections.abc import Iterator

import anthropic
import httpx
import pytest

from tests.e2e._procs import serving
from tests.e2e.conftest import PRICE, Stack

pytestmark = pytest.mark.e2e

PROMPT = "Explain the failing build step by step, with the log lines. " * 40


@pytest.fixture(scope="module")
def refining(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    def model(name: str, upstream_model: str, mode: str) -> dict[str, object]:
        return {"name": name, "price": PRICE, "refine_input": mode,
                "deployments": [{"provider": "up", "upstream_model": upstream_model}]}
    with serving(tmp_path_factory.mktemp("refine-metrics"), lambda upstream: {
        "providers": [{"name": "up", "kind": "anthropic", "base_url": upstream.url}],
        "models": [model("always", "mock-claude", "always"),
                   model("always-failing", "mock-count-error", "always"),
                   model("shortfall", "mock-claude", "on_shortfall")]}
    ) as (gateway, upstream, config):
        yield Stack(gateway=gateway, upstream=upstream, config=config)


def _samples(url: str) -> dict[str, float]:
    """Every ``mayu_input_refinement*`` sample of /metrics, by its name and labels."""
    text = httpx.get(f"{url}/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^(mayu_input_refinement\S*) (\S+)$", text, re.MULTILINE)}


def test_each_refinement_is_counted_by_outcome_and_timed(refining: Stack) -> None:
    """Counted, then the same request from the cache, a failed count, and an admission
    that needed none: each outcome counted once for the provider, each step's time in the
    histogram (a count call takes longer than a cache lookup)."""
    key = refining.team_key("metrics", "--usd-micros-per-day", "100000000")
    client = anthropic.Anthropic(base_url=refining.gateway.url, api_key=key, max_retries=0)
    assert _samples(refining.gateway.url) == {}  # nothing before the first refinement
    message = [{"role": "user", "content": PROMPT}]
    for model in ("always", "always", "always-failing", "shortfall"):
        raw = client.messages.with_raw_response.create(
            model=model, max_tokens=32, messages=message)  # type: ignore[arg-type]
        raw.parse()
    got = _samples(refining.gateway.url)
    total = 'mayu_input_refinements_total{outcome="%s",provider="up"}'
    assert got[total % "counted"] == 1
    assert got[total % "cached"] == 1
    assert got[total % "failed"] == 1
    assert got[total % "not_needed"] == 1
    assert total % "counted_prefix" not in got
    seconds = 'mayu_input_refinement_seconds_%s{outcome="%s",provider="up"}'
    for outcome in ("counted", "cached", "failed"):
        assert got[seconds % ("count", outcome)] == 1
    assert seconds % ("count", "not_needed") not in got  # nothing was done, nothing timed
    assert 0 < got[seconds % ("sum", "cached")] < got[seconds % ("sum", "counted")] < 2
