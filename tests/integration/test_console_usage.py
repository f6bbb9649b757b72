"""The console's Usage page through the real app factory (local SQLite and shared
Postgres): the chart's rects and the table carry exactly the summary API's figures,
compare mode draws two teams on one scale, a key holder sees only its own key, and
bad input is a message next to its field (never a 500)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.integration.test_console_pages import READ, SECRET, WRITE, Client, client, sign_in

pytestmark = pytest.mark.integration
__all__ = ["client"]  # the fixture, shared with test_console_pages
RECT = re.compile(r'<rect x="[^"]+" y="[^"]+" width="[^"]+" height="([^"]+)" fill="[^"]+" '
                  r'data-series="([^"]*)" data-period="([^"]+)" data-value="(\d+)">'
                  r"<title>([^<]+)</title>")


async def _key(client: Client, csrf: str, team: str, user: str) -> str:
    created = await client.post("/console/keys", data={"csrf": csrf, "team": team,
                                                       "user": user})
    found = SECRET.search(created.text)
    assert found, created.text
    return found.group(1)


async def _spend(client: Client, secret: str, model: str, n: int) -> None:
    for _ in range(n):
        r = await client.post("/v1/chat/completions", json={
            "model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == 200, r.text


def _chart(html: str, kind: str, panel: int = 0) -> list[tuple[float, str, str, int, str]]:
    figures = html.split(f'<figure class="chart" data-chart="{kind}">')[1:]
    body = figures[panel].split("</figure>")[0]
    return [(float(h), s, p, int(v), t) for h, s, p, v, t in RECT.findall(body)]


async def _summary(client: Client, **params: str) -> list[dict[str, Any]]:
    r = await client.get("/admin/v1/requests/summary", params=params,
                         headers={"Authorization": f"Bearer {READ}"})
    assert r.status_code == 200, r.text
    rows: list[dict[str, Any]] = r.json()["data"]
    return rows


async def test_usage_draws_the_summary_to_the_micro_dollar(client: Client) -> None:
    """Two teams, two models: each rect of the spend chart is one (day, model) of the
    summary with its exact µUSD in its title; the table's cells equal the summary;
    tokens likewise; by team, the series are the team names."""
    csrf = await sign_in(client, WRITE)
    for team in ("platform", "research"):
        await client.post("/console/teams", data={"csrf": csrf, "name": team})
    ana = await _key(client, csrf, "platform", "ana")
    bo = await _key(client, csrf, "research", "bo")
    await _spend(client, ana, "mock-gpt", 3)
    await _spend(client, ana, "mock-claude", 1)
    await _spend(client, bo, "mock-gpt", 2)
    page = await client.get("/console/usage")
    assert page.status_code == 200, page.text
    rows = await _summary(client, group_by="model", bucket="day",
                          since="2000-01-01T00:00:00Z")
    assert {r["model"] for r in rows} == {"mock-gpt", "mock-claude"}
    drawn = _chart(page.text, "usd")
    assert sorted((s, p, v) for _, s, p, v, _ in drawn) == sorted(
        (r["model"], r["period"], r["usd_committed"]) for r in rows)
    for _, s, p, v, title in drawn:
        assert title == f"{s} · {p}: {v:,} µUSD (${v // 1_000_000:,}.{v % 1_000_000:06d})"
    assert sum(h for h, *_ in drawn) == pytest.approx(100.0, abs=0.01)  # one day: full
    cells = [int(v) for v in re.findall(
        r'data-figure="usd_committed" data-value="(\d+)"', page.text)]
    assert sorted(cells) == sorted(r["usd_committed"] for r in rows)
    tokens = _chart(page.text, "tokens")
    assert sum(v for *_, v, _ in tokens) == sum(r["tokens_committed"] for r in rows)
    by_team = await client.get("/console/usage", params={"group": "team"})
    assert {s for _, s, *_ in _chart(by_team.text, "usd")} == {
        r["team_id"] for r in await _summary(client, group_by="team")}
    assert "platform · " in by_team.text and "research · " in by_team.text


async def test_compare_two_teams_on_one_scale(client: Client) -> None:
    """Compare platform with research: two panels, each the team's own summary, drawn
    on one scale (the same µUSD is the same height in both)."""
    csrf = await sign_in(client, WRITE)
    for team in ("platform", "research"):
        await client.post("/console/teams", data={"csrf": csrf, "name": team})
    await _spend(client, await _key(client, csrf, "platform", "ana"), "mock-gpt", 4)
    await _spend(client, await _key(client, csrf, "research", "bo"), "mock-gpt", 1)
    page = await client.get("/console/usage", params={
        "compare": "team", "a": "platform", "b": "research", "bucket": "hour",
        "since": "2000-01-01"})
    assert page.status_code == 400  # 26 years by the hour: too many to draw
    assert 'data-error-for="bucket"' in page.text
    page = await client.get("/console/usage", params={
        "compare": "team", "a": "platform", "b": "research"})
    assert page.status_code == 200, page.text
    a, b = _chart(page.text, "usd", 0), _chart(page.text, "usd", 1)
    spent = {t: sum(r["usd_committed"] for r in await _summary(client, team=t))
             for t in ("platform", "research")}
    assert sum(v for *_, v, _ in a) == spent["platform"] > 0
    assert sum(v for *_, v, _ in b) == spent["research"] > 0
    assert b[0][0] / a[0][0] == pytest.approx(spent["research"] / spent["platform"],
                                              rel=1e-3)


async def test_a_key_holder_sees_its_own_usage_only(client: Client) -> None:
    """Signed in with a key: My usage draws /v1/me/requests/summary (its own requests),
    not the other key's; /console/usage sends it to its own page."""
    csrf = await sign_in(client, WRITE)
    await client.post("/console/teams", data={"csrf": csrf, "name": "platform"})
    ana = await _key(client, csrf, "platform", "ana")
    await _spend(client, ana, "mock-gpt", 2)
    await _spend(client, await _key(client, csrf, "platform", "bo"), "mock-gpt", 3)
    own = await client.get("/v1/me/requests/summary", params={"bucket": "none"},
                           headers={"Authorization": f"Bearer {ana}"})
    client.cookies.clear()
    await sign_in(client, ana)
    r = await client.get("/console/usage")
    assert r.status_code == 303 and r.headers["location"] == "/console/me"
    page = await client.get("/console/me/usage")
    assert page.status_code == 200, page.text
    drawn = _chart(page.text, "usd")
    assert sum(v for *_, v, _ in drawn) == own.json()["data"][0]["usd_committed"] > 0
    assert 'data-total="requests">2 requests' in page.text


@pytest.mark.parametrize("params,field", [
    ({"since": "yesterday"}, "since"), ({"until": "2026-13-45"}, "until"),
    ({"group": "route"}, "group"), ({"bucket": "week"}, "bucket"),
    ({"since": "2026-12-05", "until": "2026-12-01"}, "since"),
    ({"compare": "team", "a": "platform"}, "b"), ({"team": "x" * 300}, "team")])
async def test_bad_usage_input_is_a_message_next_to_its_field(
        client: Client, params: dict[str, str], field: str) -> None:
    """A bad date, group, bucket, range, half a comparison, or a filter the API refuses:
    a 400 page with the message beside that field."""
    await sign_in(client, READ)
    page = await client.get("/console/usage", params=params)
    assert page.status_code == 400, page.text
    assert f'data-error-for="{field}"' in page.text
