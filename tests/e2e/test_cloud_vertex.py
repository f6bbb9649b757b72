"""The ``vertex`` kind: the real anthropic SDK through a real gateway to a Vertex-shaped
peer whose token endpoint google-auth really calls (tests/e2e/_cloud_peer.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from gateway.pricing import ModelPrice, Usage, cost_micro_usd
from tests.e2e._clouds import PROJECT, REGION, REGIONAL, Clouds, running_clouds
from tests.e2e.conftest import cut_stream, expected_cost

pytestmark = pytest.mark.e2e

LONG = "The quick brown fox jumps over the lazy dog. " * 8
RAW = f"/v1/projects/{PROJECT}/locations/{REGION}/publishers/anthropic/models/mock-claude"


@pytest.fixture(scope="module")
def clouds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clouds]:
    with running_clouds(tmp_path_factory.mktemp("vertex"), untrusted=True) as started:
        yield started


@pytest.fixture(scope="module")
def key(clouds: Clouds) -> str:
    return clouds.key("vertex")


@pytest.fixture(scope="module")
def claude(clouds: Clouds, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=clouds.gateway.url, api_key=key, max_retries=0)


def _one(clouds: Clouds) -> dict[str, Any]:
    entries = clouds.ledger()
    assert len(entries) == 1, entries
    return entries[0]


def _cached_system() -> list[dict[str, Any]]:
    return [{"type": "text", "text": LONG * 4, "cache_control": {"type": "ephemeral"}}]


def _ask_cached(clouds: Clouds, claude: anthropic.Anthropic, model: str
                ) -> tuple[Any, dict[str, Any]]:
    """A Messages call of ``model`` with the cached system prompt, answered, on a cleared
    ledger: (the raw answer, the peer's one record of it)."""
    clouds.clear()
    raw = claude.messages.with_raw_response.create(
        model=model, max_tokens=20, system=_cached_system(),
        messages=[{"role": "user", "content": LONG}])
    assert raw.parse().content
    return raw, _one(clouds)


def test_messages_to_vertex_raw_predict_charged_its_record(
        clouds: Clouds, claude: anthropic.Anthropic) -> None:
    """A Messages call served by Vertex's rawPredict (model in the path, vertex
    anthropic_version in the body, a google-auth token): cost == the peer's record."""
    raw, entry = _ask_cached(clouds, claude, "claude-vertex")
    assert entry["route"] == f"vertex:{PROJECT}/{REGION}:rawPredict"
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) == expected_cost(entry)
    assert clouds.requests()[-1]["path"] == f"{RAW}:rawPredict"


def test_streamed_messages_to_stream_raw_predict(clouds: Clouds,
                                                 claude: anthropic.Anthropic) -> None:
    """A stream goes to :streamRawPredict with anthropic-beta as a header; the prompt
    cache classes the peer reported are what is charged."""
    clouds.clear()
    with claude.messages.stream(
            model="claude-vertex", max_tokens=20, system=_cached_system(),
            messages=[{"role": "user", "content": LONG}],
            extra_headers={"anthropic-beta": "prompt-caching-2024-07-31"}) as stream:
        final = stream.get_final_message()
    entry = _one(clouds)
    assert final.usage.output_tokens == entry["classes"]["output"]
    assert (final.usage.cache_creation_input_tokens or 0) + (
        final.usage.cache_read_input_tokens or 0) > 0
    seen = clouds.requests()[-1]
    assert (seen["path"], seen["beta"]) == (f"{RAW}:streamRawPredict",
                                             "prompt-caching-2024-07-31")


@pytest.fixture(scope="module")
def vertex_client(clouds: Clouds, key: str) -> anthropic.AnthropicVertex:
    """The SDK's Vertex client pointed at the gateway, our key as its access token."""
    return anthropic.AnthropicVertex(region=REGION, project_id=PROJECT, access_token=key,
                                     base_url=f"{clouds.gateway.url}/v1", max_retries=0)


@pytest.mark.parametrize("model", ["claude-vertex", "claude-up"])
def test_anthropic_vertex_client_through_the_gateway(
        clouds: Clouds, vertex_client: anthropic.AnthropicVertex, model: str) -> None:
    """AnthropicVertex against the gateway's Vertex paths: answered by a Vertex or an
    Anthropic-shaped deployment alike, charged the upstream's record."""
    clouds.clear()
    raw = vertex_client.messages.with_raw_response.create(
        model=model, max_tokens=20, messages=[{"role": "user", "content": LONG}])
    assert raw.parse().content[0].type == "text"
    entry = _one(clouds)
    assert entry["route"].startswith("vertex:" if model == "claude-vertex" else "anthropic")
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) == expected_cost(entry)


def test_anthropic_vertex_stream_and_count(clouds: Clouds,
                                           vertex_client: anthropic.AnthropicVertex) -> None:
    """A streamed AnthropicVertex call (streamRawPredict) ends with the peer's usage; the
    Vertex token count answers locally."""
    clouds.clear()
    with vertex_client.messages.stream(
            model="claude-vertex", max_tokens=20, system=_cached_system(),
            messages=[{"role": "user", "content": LONG}]) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens == _one(clouds)["classes"]["output"]
    counted = vertex_client.messages.count_tokens(
        model="claude-vertex", messages=[{"role": "user", "content": LONG}])
    assert counted.input_tokens > 0


def test_vertex_path_refusals_in_anthropic_shape(clouds: Clouds, key: str) -> None:
    """No key: 401; an anthropic_version that is not a string or a model in the body:
    400; all in Anthropic's error shape, nothing sent upstream."""
    url = f"{clouds.gateway.url}{RAW.replace('mock-claude', 'claude-vertex')}:rawPredict"
    body = {"anthropic_version": "vertex-2023-10-16", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}]}
    clouds.clear()
    assert httpx.post(url, json=body).status_code == 401
    bad = httpx.post(url, json={**body, "anthropic_version": 20231016},
                     headers={"authorization": f"Bearer {key}"})
    assert (bad.status_code, bad.json()["type"]) == (400, "error")
    assert "anthropic_version" in bad.json()["error"]["message"]
    named = httpx.post(url, json={**body, "model": "claude-vertex"},
                       headers={"authorization": f"Bearer {key}"})
    assert named.status_code == 400
    assert clouds.requests() == []


def test_vertex_quota_error_in_anthropic_shape(clouds: Clouds,
                                               claude: anthropic.Anthropic) -> None:
    """Vertex's own 429 RESOURCE_EXHAUSTED (Google's shape) reaches the client as
    Anthropic's rate_limit_error with its message; nothing charged."""
    clouds.clear()
    with pytest.raises(anthropic.RateLimitError) as limited:
        claude.messages.create(model="claude-vertex-quota", max_tokens=5,
                               messages=[{"role": "user", "content": "hi"}])
    error = limited.value.body["error"]  # type: ignore[index]
    assert error["type"] == "rate_limit_error"
    assert error["message"].startswith("Vertex AI: Quota exceeded")
    assert clouds.ledger() == []


def test_a_provider_without_credentials_answers_503_alone(
        clouds: Clouds, claude: anthropic.Anthropic, key: str) -> None:
    """A service account the token endpoint refuses: its deployment answers 503 naming
    its credentials, nothing is sent or charged, the refresh failures are counted, and
    the other Vertex provider keeps serving."""
    before = clouds.committed_usd(key)
    clouds.clear()
    with pytest.raises(anthropic.APIStatusError) as refused:
        claude.messages.create(model="claude-vertex-untrusted", max_tokens=5,
                               messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 503
    assert "credentials are unavailable" in str(refused.value)
    assert clouds.requests() == [] and clouds.ledger() == []
    assert clouds.committed_usd(key) == before
    metrics = httpx.get(f"{clouds.gateway.url}/metrics").text
    assert 'mayu_credential_refresh_failures_total{provider="vertex-untrusted"}' in metrics
    assert ("credential refresh failed for provider vertex-untrusted: RefreshError: "
            "('invalid_grant: Invalid JWT Signature") in clouds.gateway.logs()
    assert claude.messages.create(model="claude-vertex", max_tokens=5,
                                  messages=[{"role": "user", "content": "hi"}]).content


@pytest.mark.parametrize("route", ["messages", "vertex"])
def test_a_cut_vertex_stream_keeps_the_three_figures(clouds: Clouds, route: str) -> None:
    """A Vertex stream the upstream breaks mid-way, asked on /v1/messages or on the
    Vertex path: the client gets the error event; what arrived commits, the rest of the
    bound is liability, nothing stays reserved."""
    key = clouds.key(f"vertex-cut-{route}")
    url, body = (f"{clouds.gateway.url}/v1/messages",
                 {"model": "claude-vertex-cut", "stream": True})
    if route == "vertex":
        url, body = (f"{clouds.gateway.url}{RAW.replace('mock-claude', 'claude-vertex-cut')}"
                     ":streamRawPredict", {"anthropic_version": "vertex-2023-10-16"})
    body.update(max_tokens=50, messages=[{"role": "user", "content": "a story"}])
    bound, text = cut_stream(url, body, {"authorization": f"Bearer {key}"})
    assert b"event: error" in text
    day = clouds.settled(key)
    assert day["usd_committed"] + day["usd_liability"] == bound
    assert 0 < day["usd_committed"] < bound


def test_client_leaving_a_vertex_stream_keeps_the_three_figures(clouds: Clouds) -> None:
    """A client that hangs up after the first event of a Vertex stream: committed is at
    least what message_start reported, committed + liability is the bound."""
    key = clouds.key("vertex-leaves")
    body = {"model": "claude-vertex-slow", "stream": True, "max_tokens": 40,
            "messages": [{"role": "user", "content": "a long story please"}]}
    with httpx.stream("POST", f"{clouds.gateway.url}/v1/messages", json=body,
                      headers={"x-api-key": key}, timeout=60) as r:
        assert r.status_code == 200
        bound = int(r.headers["x-inferplane-usd-bound"])
        next(r.iter_bytes())
    day = clouds.settled(key)
    assert day["usd_committed"] + day["usd_liability"] == bound
    assert 0 < day["usd_committed"] < bound


def test_vertex_count_refines_the_input_bound(clouds: Clouds,
                                              claude: anthropic.Anthropic) -> None:
    """refine_input: always on a vertex deployment: Vertex's count-tokens:rawPredict is
    asked (the model in its body) before the message, which is charged its record."""
    clouds.clear()
    raw = claude.messages.with_raw_response.create(
        model="claude-vertex-counted", max_tokens=20,
        messages=[{"role": "user", "content": LONG}])
    assert raw.parse().content
    paths = [r["path"] for r in clouds.requests()]
    assert paths == [RAW.replace("mock-claude", "count-tokens") + ":rawPredict",
                     f"{RAW}:rawPredict"]
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) == expected_cost(_one(clouds))


def test_a_regional_deployment_is_charged_its_own_price(
        clouds: Clouds, claude: anthropic.Anthropic) -> None:
    """A vertex deployment with its own price (a regional endpoint's premium) is
    settled at that price, not the model's, for what the peer reported."""
    raw, entry = _ask_cached(clouds, claude, "claude-vertex-regional")
    cost = cost_micro_usd(Usage(**entry["classes"]), ModelPrice(**REGIONAL))
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) == cost > expected_cost(entry)


def test_no_secret_in_any_file_of_the_run(clouds: Clouds) -> None:
    """Service-account keys, Google access tokens, api-key: none in the log, config or
    data dir after all of this module's Vertex traffic (it runs last)."""
    clouds.assert_no_secret_in_files()
