"""Member budgets (a user's within a team) and user budgets (across teams), both profiles.

Through the real app factory (local: SQLite keys and governance; shared: a migrated
Postgres) with the built-in mock provider and a write admin token: budgets set with the
admin API bind the user's keys at their next admission — in refusals (the member's or
user's counter, with its figures), in ``GET /v1/me`` and in ``GET /v1/usage`` — while the
team's other users keep being served.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from gateway.governance import CounterKey, utc_windows
from tests.integration._admin import READ, WRITE, bearer

pytestmark = pytest.mark.integration

BODY = {"model": "mock-gpt", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
W, R = bearer(WRITE), bearer(READ)


async def _key(c: AsyncTestClient[Any], team: str, user: str | None) -> str:
    r = await c.post("/admin/v1/keys", json={"team": team, "user": user}, headers=W)
    assert r.status_code == 201, r.text
    secret: str = r.json()["secret"]
    return secret


async def _chat(c: AsyncTestClient[Any], key: str) -> Any:
    return await c.post("/v1/chat/completions", json=BODY, headers=bearer(key))


async def test_a_member_budget_binds_its_user_and_not_the_teams_other_users(
        admin: tuple[AsyncTestClient[Any], Path]) -> None:
    """ana may spend two requests' worst case a day within a team that could pay for
    many: her third request (on either of her keys) is a 402 naming her member counter
    with its figures, bob's keep being served; /v1/me lists her member window with the
    store's figures, /v1/usage's ana rows hold what she committed."""
    c, audit = admin
    assert (await c.post("/admin/v1/teams", headers=W, json={
        "name": "t", "limits": {"usd_micros_per_day": 10_000_000}})).status_code == 201
    ana1, ana2, bob = (await _key(c, "t", "ana"), await _key(c, "t", "ana"),
                       await _key(c, "t", "bob"))
    probe = await _chat(c, bob)
    assert probe.status_code == 200, probe.text
    bound = int(probe.headers["x-inferplane-usd-bound"])
    cost = int(probe.headers["x-inferplane-cost-micro-usd"])
    assert 0 < cost <= bound

    limit = cost + bound  # room for two requests, not three
    put = await c.put("/admin/v1/teams/t/members/ana", headers=W,
                      json={"usd_micros_per_day": limit})
    assert put.status_code == 201, put.text
    assert put.json()["source"] == "member" and put.headers["etag"] == '"1"'
    assert (await _chat(c, ana1)).status_code == 200
    assert (await _chat(c, ana2)).status_code == 200
    refused = await _chat(c, ana1)
    assert refused.status_code == 402, refused.text
    error = refused.json()["error"]
    day, _ = utc_windows(datetime.now(UTC))
    team_id = (await c.get("/admin/v1/teams/t", headers=R)).json()["id"]
    counter = CounterKey.member(team_id, "ana").windowed("usd", "day", day).text
    assert counter in error["message"], error
    assert f"limit {limit} µUSD" in error["message"]
    assert refused.headers["x-should-retry"] == "false"
    assert "x-inferplane-window-reset" in refused.headers
    assert (await _chat(c, bob)).status_code == 200  # the team still serves bob

    me = (await c.get("/v1/me", headers=bearer(ana2))).json()
    window = next(e for e in me["limits"] if e["counter"] == counter)
    assert window["owner"] == "member" and window["limit"] == limit
    assert window["committed"] == 2 * cost and window["remaining"] == limit - 2 * cost
    usage = (await c.get("/v1/usage", headers=W)).json()["data"]
    ana = next(u for u in usage if u["scope"] == "user" and u["id"] == "ana"
               and u["window"] == "day")
    assert ana["usd_committed"] == window["committed"]

    members = (await c.get("/admin/v1/teams/t/members", headers=R)).json()
    by_user = {m["user"]: m for m in members["data"]}
    assert by_user["ana"]["keys"] == 2 and by_user["ana"]["source"] == "member"
    assert by_user["bob"]["source"] == "none" and members["default"] is None
    lines = [json.loads(x) for x in audit.read_text().splitlines()]
    assert any(x.get("action") == "member.put" and x["token"] == "terraform"
               and x["user"] == "ana" for x in lines)


async def test_the_teams_default_member_budget_binds_each_user_separately(
        admin: tuple[AsyncTestClient[Any], Path]) -> None:
    """A default of one request's worst case: ana and bob each get one request (their
    own windows), a second is refused for each; a member budget of ana's own replaces
    the default for her at once; removing it brings the default back."""
    c, _ = admin
    await c.post("/admin/v1/teams", headers=W, json={"name": "t"})
    ana, bob = await _key(c, "t", "ana"), await _key(c, "t", "bob")
    probe = await c.post("/v1/chat/completions", json=BODY, headers=bearer(
        await _key(c, "t", None)))  # a key with no user: no member budget binds it
    bound = int(probe.headers["x-inferplane-usd-bound"])
    put = await c.put("/admin/v1/teams/t/default-member", headers=W,
                      json={"usd_micros_per_day": bound})
    assert put.status_code == 201, put.text
    for key in (ana, bob):
        assert (await _chat(c, key)).status_code == 200
        assert (await _chat(c, key)).status_code == 402
    listed = (await c.get("/admin/v1/teams/t/members", headers=R)).json()
    assert {m["user"]: m["source"] for m in listed["data"]} == {"ana": "default",
                                                               "bob": "default"}
    assert (await c.put("/admin/v1/teams/t/members/ana", headers=W,
                        json={"usd_micros_per_day": 100 * bound})).status_code == 201
    assert (await _chat(c, ana)).status_code == 200
    assert (await _chat(c, bob)).status_code == 402
    stale = await c.delete("/admin/v1/teams/t/members/ana",
                           headers={**W, "If-Match": '"7"'})
    assert stale.status_code == 412, stale.text
    assert (await c.delete("/admin/v1/teams/t/members/ana",
                           headers={**W, "If-Match": '"1"'})).status_code == 200
    assert (await _chat(c, ana)).status_code == 402


async def test_a_user_budget_binds_the_user_across_teams(
        admin: tuple[AsyncTestClient[Any], Path]) -> None:
    """ana holds a key in two teams; her user budget (tokens a day) is one window for
    both: what she spends in one team is refused in the other."""
    c, _ = admin
    for team in ("a", "b"):
        await c.post("/admin/v1/teams", headers=W, json={"name": team})
    in_a, in_b = await _key(c, "a", "ana"), await _key(c, "b", "ana")
    probe = await _chat(c, await _key(c, "a", None))
    tokens = int(probe.headers["x-inferplane-token-bound"])
    put = await c.put("/admin/v1/users/ana", headers=W, json={
        "email": "ana@example.com", "limits": {"tokens_per_day": tokens}})
    assert put.status_code == 201, put.text
    assert (await _chat(c, in_a)).status_code == 200
    refused = await _chat(c, in_b)
    assert refused.status_code == 429, refused.text
    assert "user:ana:tokens:day:" in refused.json()["error"]["message"]
    assert (await c.get("/admin/v1/users/ana", headers=R)).json()["email"] == \
        "ana@example.com"
    # A raised budget binds at the next request (the teams' revisions moved).
    assert (await c.put("/admin/v1/users/ana", headers={**W, "If-Match": '"1"'}, json={
        "limits": {"tokens_per_day": 100 * tokens}})).status_code == 200
    assert (await _chat(c, in_b)).status_code == 200


async def test_member_routes_refuse_bad_input_and_read_tokens(
        admin: tuple[AsyncTestClient[Any], Path]) -> None:
    c, _ = admin
    await c.post("/admin/v1/teams", headers=W, json={"name": "t"})
    for body in ({"usd_micros_per_day": -1}, {"usd_per_day": 5}, {"tokens_per_day": 2**70},
                 ["x"]):
        r = await c.put("/admin/v1/teams/t/members/ana", headers=W, json=body)
        assert r.status_code == 400, (body, r.text)
    r = await c.put("/admin/v1/teams/t/members/ana", headers=R, json={})
    assert r.status_code == 403
    r = await c.put("/admin/v1/teams/nope/members/ana", headers=W, json={})
    assert r.status_code == 404
    r = await c.put("/admin/v1/teams/t/members/*", headers=W, json={})
    assert r.status_code == 400
    r = await c.put("/admin/v1/teams/t/members/ana", headers={**W, "If-Match": '"3"'},
                    json={})
    assert r.status_code == 412
    assert (await c.get("/admin/v1/teams/t/members/ana", headers=R)).status_code == 404
    assert (await c.get("/admin/v1/teams/t/default-member", headers=R)).status_code == 404
    assert (await c.get("/admin/v1/users/ana", headers=R)).status_code == 404
    ok = await c.put("/admin/v1/teams/t/members/ana", headers={**W, "If-Match": '"0"'},
                     json={})
    assert ok.status_code == 201, ok.text
    again = await c.put("/admin/v1/teams/t/members/ana", headers={**W, "If-Match": '"0"'},
                        json={})
    assert again.status_code == 412, again.text
