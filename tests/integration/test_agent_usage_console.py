"""The console's Usage page sets the agents' own usage reports beside the gateway's
figures (local SQLite and shared Postgres): the figures are the agent-usage API's, a gap
the API flags is marked, and a key holder sees only its own key's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration._console import chat, form_value, new_key, sign_in
from tests.integration.test_console_pages import READ, WRITE, Client, client

pytestmark = pytest.mark.integration
__all__ = ["client"]  # the fixture, shared with test_console_pages
LOGS = (Path(__file__).parent / "data" / "claude_code_export_logs.pb").read_bytes()
ROW = re.compile(r'<tr data-period="([^"]+)" data-bypass="(true|false)">(.*?)</tr>', re.S)
CELL = re.compile(r'data-figure="(\w+)" data-value="(-?\d+)"')


def _reported_rows(html: str) -> list[tuple[str, dict[str, int]]]:
    section = html.split('data-panel="reported"')[1]
    return [(bypass, {k: int(v) for k, v in CELL.findall(cells)})
            for _, bypass, cells in ROW.findall(section)]


async def test_usage_shows_what_the_agents_reported_beside_the_gateway(client: Client) -> None:
    """A key's chat through the gateway and Claude Code's report of a request it never
    saw: the row holds the API's figures and is marked as a bypass; the key holder's
    own page shows the same, another key's shows no such table."""
    csrf = await sign_in(client, WRITE)
    key = await new_key(client, csrf, "platform")
    other = await new_key(client, csrf, "platform")
    await chat(client, key)
    r = await client.post("/v1/logs", content=LOGS, headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/x-protobuf"})
    assert r.status_code == 200, r.content
    api = (await client.get("/admin/v1/agent-usage", params={"group_by": "team,user"},
                            headers={"Authorization": f"Bearer {READ}"})).json()
    (want,) = [r for r in api["data"] if r["reported"]["reports"]]
    assert want["bypass_suspected"] is True
    figures = {"tokens_committed": want["gateway"]["tokens_committed"],
               "tokens_reported": 16728, "gap_tokens": want["gap_tokens"],
               "usd_committed": want["gateway"]["usd_committed"],
               "reported_cost_uusd": 81846}
    page = await client.get("/console/usage")
    assert page.status_code == 200, page.text
    assert _reported_rows(page.text) == [("true", figures)]
    await client.post("/console/logout", data={"csrf": csrf})
    await sign_in(client, key)
    mine = await client.get("/console/me/usage")
    assert _reported_rows(mine.text) == [("true", figures)]
    await client.post("/console/logout", data={"csrf": form_value(mine.text)})
    await sign_in(client, other)
    await chat(client, other)
    theirs = await client.get("/console/me/usage")
    assert theirs.status_code == 200 and 'data-panel="reported"' not in theirs.text

