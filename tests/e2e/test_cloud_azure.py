"""The ``azure`` kind: the real openai SDK through a real gateway to an Azure-shaped peer
that checks ``api-key`` / Entra tokens and ``api-version`` (tests/e2e/_cloud_peer.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.e2e._clouds import Clouds, running_clouds
from tests.e2e.conftest import expected_cost

pytestmark = pytest.mark.e2e

LONG = "The quick brown fox jumps over the lazy dog. " * 8


@pytest.fixture(scope="module")
def clouds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clouds]:
    with running_clouds(tmp_path_factory.mktemp("azure"), token_ttl_s=30) as started:
        yield started


@pytest.fixture(scope="module")
def oai(clouds: Clouds) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{clouds.gateway.url}/v1", api_key=clouds.key("azure"),
                         max_retries=0)


def _one(clouds: Clouds) -> dict[str, Any]:
    entries = clouds.ledger()
    assert len(entries) == 1, entries
    return entries[0]


@pytest.mark.parametrize(("model", "path", "auth"), [
    ("gpt-azure", "/openai/v1/chat/completions", "api-key"),
    ("gpt-azure-dep", "/openai/deployments/mock-gpt/chat/completions", "api-key"),
    ("gpt-azure-entra", "/openai/v1/chat/completions", "bearer"),
    ("gpt-azure-secret", "/openai/v1/chat/completions", "bearer")])
def test_chat_reaches_each_azure_form_and_is_charged_its_record(
        clouds: Clouds, oai: openai.OpenAI, model: str, path: str, auth: str) -> None:
    """Chat on the v1 API, the deployment form and with Entra tokens (managed identity,
    client credentials): the peer saw its path, auth and api-version, and the cost header
    equals the peer's record (cache read included)."""
    clouds.clear()
    raw = oai.chat.completions.with_raw_response.create(
        model=model, max_tokens=20, messages=[{"role": "user", "content": LONG}])
    assert raw.parse().choices[0].message.content
    entry = _one(clouds)
    assert entry["classes"]["cache_read"] > 0
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) == expected_cost(entry)
    seen = clouds.requests()[-1]
    assert (seen["path"], seen["auth"]) == (path, auth)
    if model == "gpt-azure-dep":
        assert seen["query"] == {"api-version": "2024-10-21"}


def test_streamed_chat_and_responses_are_charged_their_record(
        clouds: Clouds, oai: openai.OpenAI) -> None:
    """A streamed chat and a streamed Responses call to Azure: committed == the peer's
    record to the µUSD."""
    key_usage_before = clouds.committed_usd(oai.api_key)
    clouds.clear()
    chunks = list(oai.chat.completions.create(
        model="gpt-azure-entra", max_tokens=12, stream=True,
        messages=[{"role": "user", "content": LONG}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    events = list(oai.responses.create(model="gpt-azure-dep", input=LONG,
                                       max_output_tokens=16, stream=True))
    assert events[-1].type == "response.completed"
    entries = clouds.ledger()
    assert len(entries) == 2, entries
    assert [r["path"] for r in clouds.requests()] == ["/openai/v1/chat/completions",
                                                      "/openai/responses"]
    spent = clouds.committed_usd(oai.api_key) - key_usage_before
    assert spent == sum(expected_cost(e) for e in entries)


def test_embeddings_on_the_deployment_form(clouds: Clouds, oai: openai.OpenAI) -> None:
    """Embeddings go to /openai/deployments/{d}/embeddings with the api-version."""
    clouds.clear()
    raw = oai.embeddings.with_raw_response.create(model="gpt-azure-dep", input="hello")
    assert raw.parse().data
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) == expected_cost(_one(clouds))
    assert clouds.requests()[-1]["path"] == "/openai/deployments/mock-gpt/embeddings"


def test_entra_token_refreshed_before_expiry_without_a_failed_request(
        clouds: Clouds, oai: openai.OpenAI) -> None:
    """Entra tokens living 30 s are replaced off the request path: requests across two
    expiries all succeed, each with a token the peer still honours."""
    end = time.monotonic() + 75
    while len(clouds.issued()["azure"]) < 3:
        assert time.monotonic() < end, clouds.issued()
        oai.chat.completions.create(model="gpt-azure-entra", max_tokens=4,
                                    messages=[{"role": "user", "content": "hi"}])
        time.sleep(1)
    oai.chat.completions.create(model="gpt-azure-entra", max_tokens=4,
                                messages=[{"role": "user", "content": "hi"}])


def test_azure_refusing_the_gateways_key_is_the_gateways_500(
        clouds: Clouds, oai: openai.OpenAI) -> None:
    """Azure's 401 for the gateway's own api-key reaches the client as a 500 in OpenAI's
    shape naming the provider (never a 401 about the client's key); nothing charged."""
    before = clouds.committed_usd(oai.api_key)
    with pytest.raises(openai.InternalServerError) as failed:
        oai.chat.completions.create(model="gpt-azure-wrong-key", max_tokens=4,
                                    messages=[{"role": "user", "content": "hi"}])
    assert "azure-wrong-key refused the gateway's credentials" in str(failed.value)
    assert clouds.committed_usd(oai.api_key) == before


def test_no_secret_in_any_file_of_the_run(clouds: Clouds) -> None:
    """api-key, identity header, access tokens: none in the log, config or data dir."""
    clouds.assert_no_secret_in_files()
