"""The request log's facts beyond a permit: route, deployment, client tool, HTTP status
and tokens per class, on both profiles through the real app factory (built-in mock
provider, Litestar's in-process client).

Each request names its client the way the real tools do in their User-Agent; the
settlement keeps the facts in its own statement, and the log, its CSV and its summary
show them: the tokens per class are what the answer's own ``usage`` reported.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from gateway.ingress._client import client_tool
from tests.integration._admin import READ, WRITE

pytestmark = pytest.mark.integration

AGENTS = {"claude-code": "claude-cli/2.1.197 (external, cli)",
          "codex": "codex_cli_rs/0.171.0 (Debian 13; x86_64) xterm",
          "openai-python": "OpenAI/Python 2.8.1",
          "anthropic-python": "Anthropic/Python 0.75.0"}


@pytest.fixture
def client(admin: tuple[AsyncTestClient[Any], Path]) -> AsyncTestClient[Any]:
    """The ``admin`` fixture's client (both profiles)."""
    return admin[0]


def test_client_tool_names_the_agents_and_sdks() -> None:
    for name, agent in AGENTS.items():
        assert client_tool(agent) == name
    assert client_tool("codex_exec/0.171.0") == "codex"
    assert client_tool("Mozilla/5.0") == "other"
    assert client_tool(None) is None and client_tool("  ") is None


async def test_the_log_keeps_route_deployment_tool_status_and_classes(
        client: AsyncTestClient[Any]) -> None:
    c = client
    admin, reader = {"Authorization": f"Bearer {WRITE}"}, {"Authorization": f"Bearer {READ}"}
    assert (await c.post("/admin/v1/teams", json={"name": "t"}, headers=admin)
            ).status_code == 201
    made = await c.post("/admin/v1/keys", json={"team": "t"}, headers=admin)
    key, key_id = made.json()["secret"], made.json()["key"]["key_id"]
    assert made.json()["key"]["last_used_at"] is None
    answers: dict[str, dict[str, Any]] = {}
    for tool, agent in AGENTS.items():
        headers = {"Authorization": f"Bearer {key}", "User-Agent": agent}
        if tool.startswith(("claude", "anthropic")):
            r = await c.post("/v1/messages", headers=headers, json={
                "model": "mock-claude", "max_tokens": 16,
                "system": [{"type": "text", "text": "be brief " * 40,
                            "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": f"hi from {tool}"}]})
        else:
            r = await c.post("/v1/chat/completions", headers=headers, json={
                "model": "mock-gpt", "max_tokens": 16,
                "messages": [{"role": "user", "content": f"hi from {tool} " * 30}]})
        assert r.status_code == 200, r.text
        answers[tool] = r.json()["usage"]

    page = await c.get("/admin/v1/requests", headers=reader)
    assert page.status_code == 200, page.text
    rows = {row["tool"]: row for row in page.json()["data"]}
    assert set(rows) == set(AGENTS)
    for tool, row in rows.items():
        usage = answers[tool]
        assert row["http_status"] == 200 and row["status"] == "complete"
        if tool.startswith(("claude", "anthropic")):
            assert (row["route"], row["deployment"]) == ("/v1/messages", "mock/mock-claude")
            assert row["input_tokens"] == usage["input_tokens"]
            assert row["output_tokens"] == usage["output_tokens"]
            assert row["cache_read_tokens"] == usage["cache_read_input_tokens"]
            assert (row["cache_write_5m_tokens"] or 0) + (row["cache_write_1h_tokens"] or 0) \
                + (row["cache_write_unknown_tokens"] or 0) == \
                usage["cache_creation_input_tokens"]
        else:
            assert (row["route"], row["deployment"]) == ("/v1/chat/completions",
                                                         "mock/mock-gpt")
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            assert row["input_tokens"] == usage["prompt_tokens"] - cached
            assert row["cache_read_tokens"] == cached
            assert row["output_tokens"] == usage["completion_tokens"]

    only = await c.get("/admin/v1/requests", params={"tool": "codex"}, headers=reader)
    assert [r["tool"] for r in only.json()["data"]] == ["codex"]
    summary = await c.get("/admin/v1/requests/summary",
                          params={"group_by": "tool", "bucket": "none"}, headers=reader)
    assert summary.status_code == 200, summary.text
    by_tool = {r["tool"]: r for r in summary.json()["data"]}
    assert {t: r["usd_committed"] for t, r in by_tool.items()} == \
        {t: r["usd_committed"] for t, r in rows.items()}
    exported = await c.get("/admin/v1/requests.csv", headers=reader)
    table = list(csv.DictReader(io.StringIO(exported.text)))
    assert {r["tool"]: r["input_tokens"] for r in table} == \
        {t: str(r["input_tokens"]) for t, r in rows.items()}
    bad = await c.get("/admin/v1/requests", params={"tool": "Not A Tool!"}, headers=reader)
    assert bad.status_code == 400

    # The key's last use is its newest request in the log.
    newest = max(row["created_at"] for row in rows.values())
    got = (await c.get(f"/admin/v1/keys/{key_id}", headers=reader)).json()
    listed = (await c.get("/admin/v1/keys", headers=reader)).json()["data"]
    assert got["last_used_at"] == newest == listed[0]["last_used_at"]
