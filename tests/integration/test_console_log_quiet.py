"""What a console page costs the server log and the API (both profiles, the real app).

The console reads the admin API in-process (:mod:`gateway.console._client`); those calls
never leave the process, so they write nothing to the log at INFO, and a team without a
default member budget is drawn without asking the API for one (no 404 round trip).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gateway.console._client import Answer, Api
from tests.integration.test_console_pages import WRITE, Client, sign_in
from tests.integration.test_console_pages import client as client  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

PAGES = ("/console/overview", "/console/teams", "/console/keys", "/console/users",
         "/console/requests", "/console/usage", "/console/operations")


async def test_console_pages_log_nothing_at_info_and_ask_for_no_missing_default(
        client: Client, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every admin page, a team's page included, writes no httpx line at INFO (each
    wrote 4-7), and a team without a default member budget asks the API nothing that
    answers 404."""
    csrf = await sign_in(client, WRITE)
    r = await client.post("/console/teams", data={"csrf": csrf, "name": "platform"})
    assert r.status_code == 303, r.text
    team_page = r.headers["location"]
    answered: list[tuple[str, str, int]] = []
    call = Api.call

    async def recorded(self: Api, method: str, path: str, **kwargs: Any) -> Answer:
        answer = await call(self, method, path, **kwargs)
        answered.append((method, path, answer.status))
        return answer

    monkeypatch.setattr(Api, "call", recorded)
    caplog.set_level(logging.INFO)
    caplog.clear()  # the sign-in's lines, captured when an earlier test left httpx at INFO
    for path in (*PAGES, team_page):
        page = await client.get(path)
        assert page.status_code == 200, (path, page.text)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("httpx")]
    # The test's own client is httpx too: its 8 requests are the only lines.
    assert len(lines) == len(PAGES) + 1
    assert all("http://testserver.local/console/" in line for line in lines), lines
    assert len(answered) >= 2 * len(PAGES)  # the pages did call the API
    assert [a for a in answered if a[2] >= 400] == []
    assert not any(p.endswith("/default-member") for _, p, _ in answered)
