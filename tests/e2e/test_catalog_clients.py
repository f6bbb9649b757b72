"""examples/real-providers.yaml as shipped — catalog prices and limits, no hand-written
figures — serving Codex- and Claude-Code-shaped traffic, with ``mock-upstream`` standing
in for both providers (only the base URLs are changed). Also: ``models.retrieve`` in both
real SDKs, and the JSON nesting limit on every route of a real ``mayu serve``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from gateway.catalog import builtin_catalog
from gateway.jsondepth import MAX_JSON_DEPTH
from gateway.pricing import Usage, cost_micro_usd
from tests.e2e._procs import (
    ROOT,
    Proc,
    create_key,
    create_team,
    serving,
)
from tests.e2e.conftest import Stack

pytestmark = pytest.mark.e2e

EXAMPLE = ROOT / "examples" / "real-providers.yaml"
PROVIDER_KEYS = {"OPENAI_API_KEY": "sk-test-openai", "ANTHROPIC_API_KEY": "sk-test-anthropic"}
DEEP = b"[" * 100_000 + b"]" * 100_000
"""100k levels: far past the limit, and past every decoder's recursion limit."""


@dataclass
class Served(Stack):
    """The example's gateway and upstream, and a key of its team."""

    key: str

    def team_day(self) -> dict[str, Any]:
        return self.usage(self.key).get(("team", "day"), {})

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


def _example_against(upstream: Proc, workdir: Path) -> dict[str, Any]:
    """The shipped example with only what a test must change: base URLs and the data dir."""
    config: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    for provider in config["providers"]:
        provider["base_url"] = (f"{upstream.url}/v1" if provider["kind"] == "openai"
                                else upstream.url)
    config["data_dir"] = str(workdir / "data")
    return config


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    workdir = tmp_path_factory.mktemp("catalog")
    with serving(workdir, lambda upstream: _example_against(upstream, workdir),
                 env=PROVIDER_KEYS) as (gateway, upstream, config):
        create_team(config, "agents", "--usd-per-day", "100.00")
        yield Served(gateway=gateway, upstream=upstream, config=config,
                     key=create_key(config, "agents"))


def _catalog_cost(entry: dict[str, Any], model: str) -> int:
    """The ledger entry priced at the catalog's figures for ``model``."""
    found = builtin_catalog().get(model)
    assert found is not None
    return cost_micro_usd(Usage(**entry["classes"]), found.price)


def _only_entry(served: Served) -> dict[str, Any]:
    entries = served.ledger()
    assert len(entries) == 1, entries
    return entries[0]


CODEX_TOOLS: list[Any] = [
    {"type": "function", "name": "shell", "description": "Runs a shell command.",
     "strict": False, "parameters": {"type": "object", "properties": {
         "command": {"type": "array", "items": {"type": "string"}},
         "workdir": {"type": "string"}}, "required": ["command"]}},
    {"type": "web_search"},
    {"type": "tool_search"},
]


def _codex_request(**extra: Any) -> dict[str, Any]:
    """What Codex CLI sends: instructions, input items, hosted tools, no max_output_tokens."""
    return {"model": "gpt-5.1-codex", "instructions": "You are Codex, a coding agent.",
            "input": [{"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "List the files in this repository."}]}],
            "tools": CODEX_TOOLS, "tool_choice": "auto", "parallel_tool_calls": False,
            "reasoning": {"effort": "medium", "summary": "auto"}, "store": False,
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "session-1",
            **extra}


def test_codex_request_with_hosted_tools_is_admitted_and_priced_from_the_catalog(
        served: Served) -> None:
    """A Codex-shaped Responses call with web_search/tool_search is bounded by the catalog's
    context window (no hand-set max_input_tokens) and costs the catalog price exactly."""
    client = openai.OpenAI(base_url=f"{served.gateway.url}/v1", api_key=served.key,
                           max_retries=0)
    served.clear_ledger()
    raw = client.responses.with_raw_response.create(**_codex_request())
    assert raw.parse().status == "completed"
    entry = _only_entry(served)
    assert entry["model"] == "gpt-5.1-codex"
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) == _catalog_cost(entry,
                                                                            "gpt-5.1-codex")


def test_codex_stream_commits_the_catalog_price(served: Served) -> None:
    """Codex streams: the committed money for the stream is the catalog price of what the
    upstream reported."""
    client = openai.OpenAI(base_url=f"{served.gateway.url}/v1", api_key=served.key,
                           max_retries=0)
    before = served.team_day().get("usd_committed", 0)
    served.clear_ledger()
    events = list(client.responses.create(**_codex_request(stream=True)))
    assert events[-1].type == "response.completed"
    entry = _only_entry(served)
    assert served.team_day()["usd_committed"] - before == _catalog_cost(entry,
                                                                        "gpt-5.1-codex")


def _claude_code_request(model: str) -> dict[str, Any]:
    """What Claude Code sends: a cached system prompt, tools (the last cached for 1h),
    a cached user turn, and its beta header."""
    return {"model": model, "max_tokens": 512,
            "system": [{"type": "text", "text": "You are Claude Code. " * 40,
                        "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "Bash", "description": "Run a command.",
                       "input_schema": {"type": "object",
                                        "properties": {"command": {"type": "string"}},
                                        "required": ["command"]}},
                      {"name": "Read", "description": "Read a file.",
                       "input_schema": {"type": "object",
                                        "properties": {"file_path": {"type": "string"}}},
                       "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What does this repository do?",
                 "cache_control": {"type": "ephemeral"}}]}],
            "extra_headers": {"anthropic-beta": "prompt-caching-2024-07-31"}}


@pytest.mark.parametrize("model", ["claude-sonnet-4-6", "claude-haiku-4-5-20251001"])
def test_claude_code_request_is_priced_per_cache_class_from_the_catalog(
        served: Served, model: str) -> None:
    """A Claude-Code-shaped Messages call with tools and cache_control: every cache class
    (read, 5m write, 1h write) is charged at the catalog's figure for that model."""
    client = anthropic.Anthropic(base_url=served.gateway.url, api_key=served.key,
                                 max_retries=0)
    served.clear_ledger()
    raw = client.messages.with_raw_response.create(**_claude_code_request(model))
    message = raw.parse()
    entry = _only_entry(served)
    classes = entry["classes"]
    assert classes["cache_write_5m"] > 0 and classes["cache_write_1h"] > 0
    assert message.usage.cache_read_input_tokens
    assert int(raw.headers["x-inferplane-cost-micro-usd"]) == _catalog_cost(entry, model)


def test_claude_code_stream_commits_the_catalog_price(served: Served) -> None:
    """Claude Code streams; the stream commits the catalog price of its reported usage."""
    client = anthropic.Anthropic(base_url=served.gateway.url, api_key=served.key,
                                 max_retries=0)
    before = served.team_day().get("usd_committed", 0)
    served.clear_ledger()
    with client.messages.stream(**_claude_code_request("claude-sonnet-4-6")) as stream:
        final = stream.get_final_message()
    assert final.stop_reason
    entry = _only_entry(served)
    assert served.team_day()["usd_committed"] - before == _catalog_cost(entry,
                                                                        "claude-sonnet-4-6")


def test_models_retrieve_works_in_both_sdks(served: Served) -> None:
    """models.retrieve answers each SDK in its own shape, with the catalog's limits."""
    oai = openai.OpenAI(base_url=f"{served.gateway.url}/v1", api_key=served.key,
                        max_retries=0).models.retrieve("gpt-5.1-codex")
    assert (oai.id, oai.object, oai.owned_by) == ("gpt-5.1-codex", "model", "inferplane")
    claude = anthropic.Anthropic(base_url=served.gateway.url, api_key=served.key,
                                 max_retries=0).models.retrieve("claude-sonnet-4-6")
    assert (claude.id, claude.type, claude.display_name) == ("claude-sonnet-4-6", "model",
                                                             "claude-sonnet-4-6")
    assert claude.created_at.year == 1970
    assert (claude.max_input_tokens, claude.max_tokens) == (1_000_000, 128_000)


def test_unknown_or_forbidden_models_are_404_in_each_sdks_shape(served: Served) -> None:
    """Not configured, or not allowed for this key: the same 404, in the caller's shape."""
    limited = create_key(served.config, "agents", "--models", "gpt-5.1")
    for key, name in ((served.key, "gpt-9"), (limited, "gpt-5.1-codex")):
        with pytest.raises(openai.NotFoundError) as oai_err:
            openai.OpenAI(base_url=f"{served.gateway.url}/v1", api_key=key,
                          max_retries=0).models.retrieve(name)
        body = oai_err.value.response.json()
        assert body["error"]["code"] == "model_not_found", body
        assert set(body["error"]) == {"message", "type", "param", "code"}
        with pytest.raises(anthropic.NotFoundError) as claude_err:
            anthropic.Anthropic(base_url=served.gateway.url, api_key=key,
                                max_retries=0).models.retrieve(name)
        body = claude_err.value.response.json()
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error", body
    assert openai.OpenAI(base_url=f"{served.gateway.url}/v1", api_key=limited,
                         max_retries=0).models.retrieve("gpt-5.1").id == "gpt-5.1"


CAPTURED = ROOT / "tests" / "e2e" / "data"
CLAUDE_CODE_BETA = ("claude-code-20250219,interleaved-thinking-2025-05-14,"
                    "thinking-token-count-2026-05-13,context-management-2025-06-27,"
                    "prompt-caching-scope-2026-01-05,effort-2025-11-24")


@pytest.mark.parametrize(("capture", "path", "headers"), [
    ("codex-cli-0.171.0-responses.json", "/v1/responses", {}),
    ("claude-code-2.1.197-messages.json", "/v1/messages?beta=true",
     {"anthropic-version": "2023-06-01", "anthropic-beta": CLAUDE_CODE_BETA}),
], ids=["codex-cli", "claude-code"])
def test_captured_agent_requests_stream_at_the_catalog_price(
        served: Served, capture: str, path: str, headers: dict[str, str]) -> None:
    """Requests captured from real Codex CLI and Claude Code (tests/e2e/data) stream through
    the example config and commit exactly the catalog price of the reported usage."""
    body = (CAPTURED / capture).read_bytes()
    model = json.loads(body)["model"]
    before = served.team_day().get("usd_committed", 0)
    served.clear_ledger()
    with httpx.stream("POST", f"{served.gateway.url}{path}", content=body, timeout=60,
                      headers={**served.auth, **headers,
                               "content-type": "application/json"}) as r:
        assert r.status_code == 200, r.read()
        events = r.read().decode()
    assert "usage" in events
    entry = _only_entry(served)
    assert served.team_day()["usd_committed"] - before == _catalog_cost(entry, model)


OPENAI_ROUTES = ("/v1/chat/completions", "/v1/responses", "/v1/embeddings")
ANTHROPIC_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")
GET_ROUTES = ("/v1/models", "/v1/models/gpt-5.1", "/v1/usage", "/healthz", "/readyz",
              "/metrics")


@pytest.mark.parametrize("body", [DEEP, b'{"model": "gpt-5.1", "input": '
                                  + b"[" * 500 + b"]" * 500 + b"}"],
                         ids=["100k-levels", "500-levels"])
def test_deep_json_is_a_400_in_each_routes_shape_and_charges_nothing(
        served: Served, body: bytes) -> None:
    """Every body-reading route refuses deep nesting with a 400 naming the limit, in its own
    error shape; no provider is called, no permit written, nothing logged as unhandled."""
    served.clear_ledger()
    before = served.team_day()
    headers = {**served.auth, "content-type": "application/json"}
    for path in OPENAI_ROUTES + ANTHROPIC_ROUTES:
        r = httpx.post(f"{served.gateway.url}{path}", content=body, headers=headers,
                       timeout=30)
        assert r.status_code == 400, (path, r.text)
        err = r.json()["error"]
        assert f"more than {MAX_JSON_DEPTH} levels" in err["message"], (path, err)
        if path in ANTHROPIC_ROUTES:
            assert r.json()["type"] == "error" and err["type"] == "invalid_request_error"
        else:
            assert err["code"] == "json_too_deep" and err["type"] == "invalid_request_error"
    for path in GET_ROUTES:  # routes that read no body ignore one, whatever it holds
        r = httpx.request("GET", f"{served.gateway.url}{path}", content=body,
                          headers=headers, timeout=30)
        assert r.status_code == 200, (path, r.text)
    assert served.ledger() == []
    assert served.team_day() == before
    logs = served.gateway.logs()
    assert "unhandled" not in logs and "Traceback" not in logs and "RecursionError" not in logs


def test_the_mock_upstream_refuses_deep_json_too(served: Served) -> None:
    """mayu mock-upstream (the stand-in provider) answers deep nesting with a 400 as well."""
    r = httpx.post(f"{served.upstream.url}/v1/chat/completions", content=DEEP, timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "levels" in r.json()["error"]["message"]
    assert "Traceback" not in served.upstream.logs()


def test_models_list_reports_the_catalog_as_the_source(served: Served) -> None:
    """`mayu models list --json` on the example: every figure of a catalog model is sourced
    'catalog <as_of>' except the input overhead (a gateway default)."""
    from tests.e2e._procs import run_cli

    done = run_cli("models", "list", "--config", str(served.config), "--json",
                   env=PROVIDER_KEYS)
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    label = builtin_catalog().label
    for model in listing["models"]:
        assert model["catalog"] is not None, model["name"]
        sources = {k: v["source"] for k, v in model["figures"].items()}
        assert sources.pop("input_overhead_tokens") == "default"
        assert set(sources.values()) == {label}, (model["name"], sources)
