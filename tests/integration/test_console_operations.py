"""Operations, request drill-down and Overview alerts, through the real app factory
(local SQLite and shared Postgres), with the mock provider's misbehaving models: a
stream cut before its usage leaves an uncertain permit (its bounds as liability), a
negative usage freezes the windows it charged.

The console's actions go through the admin API (``/admin/v1/permits/{id}/resolve``,
``/admin/v1/frozen/unfreeze``), the API through the functions ``mayu permits resolve``
and ``mayu accounts unfreeze`` call; a read token sees no action and its forged POST
changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.app import create_app
from gateway.schema import code_heads
from tests.integration._admin import gateway_settings
from tests.integration.test_console_pages import READ, SECRET, TOKENS, WRITE, Client, sign_in

pytestmark = pytest.mark.integration
CUT, BAD = "mock-cut-stream", "mock-negative-usage"


@pytest.fixture(params=["local", "shared"])
async def ops(request: pytest.FixtureRequest, tmp_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Client]:
    """A fresh gateway with a write and a read token and two misbehaving mock models."""
    settings = gateway_settings(request, tmp_path, monkeypatch, profile=request.param,
                                tokens=TOKENS)
    settings = replace(settings, models=[
        *settings.models, *(replace(settings.models[0], name=n) for n in (CUT, BAD))])
    async with AsyncTestClient(app=create_app(settings)) as c:
        c.follow_redirects = False
        yield c


async def _team_key(c: Client, csrf: str, **limits: str) -> str:
    r = await c.post("/console/teams", data={"csrf": csrf, "name": "platform", **limits})
    assert r.status_code == 303, r.text
    created = await c.post("/console/keys", data={"csrf": csrf, "team": "platform",
                                                  "user": "ana"})
    found = SECRET.search(created.text)
    assert found
    return found.group(1)


async def _call(c: Client, secret: str, model: str, *, stream: bool = False) -> int:
    r = await c.post("/v1/chat/completions", json={
        "model": model, "max_tokens": 16, "stream": stream,
        "messages": [{"role": "user", "content": "hello"}]},
        headers={"Authorization": f"Bearer {secret}"})
    return r.status_code


async def _api(c: Client, path: str, token: str = READ, **params: str) -> Any:
    r = await c.get(path, params=params, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return r.json()


def _audit(c: Client) -> list[dict[str, Any]]:
    path = Path(c.app.state.gateway.audit.path)
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


async def test_an_uncertain_permit_is_resolved_at_an_exact_cost_from_the_console(
        ops: Client) -> None:
    """A cut stream leaves the permit uncertain with its bound as liability: listed by
    the API and the page; settled from the page at an exact µUSD figure, its liability
    is gone (the API, the page and the request's drill-down agree) and the audit names
    the write token; the same form again is a replay (nothing changed, no second audit
    line); another figure, or cancelling it, is a 409 naming the stored settlement, shown
    on the page."""
    csrf = await sign_in(ops, WRITE)
    secret = await _team_key(ops, csrf, usd_micros_per_day="100000000")
    await _call(ops, secret, CUT, stream=True)
    listed = (await _api(ops, "/admin/v1/permits", status="uncertain"))["data"]
    assert len(listed) == 1 and 0 < listed[0]["usd_liability"] <= listed[0]["usd_bound"]
    permit = listed[0]["permit_id"]
    page = await ops.get("/console/operations")
    assert page.status_code == 200, page.text
    assert f'<tr data-permit="{permit}" data-status="uncertain">' in page.text
    r = await ops.post(f"/console/operations/permits/{permit}/resolve",
                       data={"csrf": csrf, "usd_micros": "1234", "tokens": "20",
                             "reason": "provider invoice"})
    assert r.status_code == 303, r.text
    assert (await _api(ops, "/admin/v1/permits", status="uncertain"))["data"] == []
    detail = await _api(ops, f"/admin/v1/requests/{permit}")
    assert (detail["request"]["status"], detail["request"]["usd_committed"],
            detail["request"]["usd_liability"]) == ("complete", 1234, 0)
    assert detail["request"]["detail"] == "operator: provider invoice"
    assert [{k: v for k, v in x.items() if k != "ts"} for x in _audit(ops)
            if x.get("action") == "permit.resolve"] == [
        {"event": "admin", "action": "permit.resolve", "token": "ops", "permit": permit,
         "outcome": "complete", "usd_committed": 1234, "usd_liability": 0,
         "reason": "provider invoice"}]
    again = await ops.post(f"/console/operations/permits/{permit}/resolve",
                           data={"csrf": csrf, "usd_micros": "1234", "tokens": "20",
                                 "reason": "provider invoice"})
    assert again.status_code == 303, again.text
    assert "already%20resolved%20so" in again.headers["location"]
    assert len([x for x in _audit(ops) if x.get("action") == "permit.resolve"]) == 1
    again = await ops.post(f"/console/operations/permits/{permit}/resolve",
                           data={"csrf": csrf, "usd_micros": "1235", "tokens": "20",
                                 "reason": "provider invoice"})
    assert again.status_code == 409
    assert f'data-refused="{permit}"' in again.text
    assert "already settled as complete: committed 20 tokens, $0.001234" in again.text
    refused = await ops.post("/admin/v1/permits/" + permit + "/resolve",
                             json={"as": "cancelled"},
                             headers={"Authorization": f"Bearer {WRITE}"})
    assert refused.status_code == 409 and "already settled as complete" in refused.text
    shown = await ops.get(f"/console/requests/{permit}")
    assert shown.status_code == 200
    assert 'data-figure="usd_committed">1,234 µUSD ($0.001234)' in shown.text
    assert shown.text.count("<tr data-segment=") == len(detail["segments"]) > 0
    for c in ("input", "output"):  # tokens per class, as the request log recorded them
        figure = detail["request"][f"{c}_tokens"]
        shown_figure = ("—" if figure is None
                        else f"{figure:,} token{'' if figure == 1 else 's'}")
        assert f'data-class="{c}">{shown_figure}<' in shown.text
    assert any(s["limit"] == 100_000_000 and s["dimension"] == "usd"
               for s in detail["segments"])  # the team's day window


async def test_a_frozen_window_is_listed_and_unfrozen_from_the_console(ops: Client) -> None:
    """Negative usage freezes the team's and key's money windows: the next request is
    refused (402); the page lists each frozen counter with the permit that froze it;
    Unfreeze lifts it (the API lists none, the audit names the token) and requests
    pass again."""
    csrf = await sign_in(ops, WRITE)
    secret = await _team_key(ops, csrf, usd_micros_per_day="100000000")
    await _call(ops, secret, BAD)
    frozen = (await _api(ops, "/admin/v1/frozen"))["data"]
    assert frozen and all(f["frozen_by"] for f in frozen)
    assert await _call(ops, secret, "mock-gpt") == 402
    page = await ops.get("/console/operations")
    for f in frozen:
        assert f'<tr data-counter="{f["counter"]}">' in page.text
        r = await ops.post("/console/operations/unfreeze",
                           data={"csrf": csrf, "counter": f["counter"]})
        assert r.status_code == 303, r.text
    assert (await _api(ops, "/admin/v1/frozen"))["data"] == []
    assert await _call(ops, secret, "mock-gpt") == 200
    lifted = [x["counter"] for x in _audit(ops) if x.get("action") == "counter.unfreeze"]
    assert sorted(lifted) == sorted(f["counter"] for f in frozen)
    unknown = await ops.post("/console/operations/unfreeze",
                             data={"csrf": csrf, "counter": "team:nope:usd:day:2026-01-01"})
    assert unknown.status_code == 404 and "no such counter" in unknown.text


async def test_a_read_token_sees_operations_but_no_action(ops: Client) -> None:
    """Read token: the page shows the uncertain permit and the status with no form that
    writes; its forged resolve (with its own CSRF token) and the API call are refused,
    and the permit still holds its liability."""
    csrf = await sign_in(ops, WRITE)
    secret = await _team_key(ops, csrf)
    await _call(ops, secret, CUT, stream=True)
    [permit] = (await _api(ops, "/admin/v1/permits", status="uncertain"))["data"]
    ops.cookies.clear()
    csrf = await sign_in(ops, READ)
    page = await ops.get("/console/operations")
    assert page.status_code == 200 and permit["permit_id"] in page.text
    assert 'method="post"' not in page.text.replace(
        'method="post" action="/console/logout"', "")
    r = await ops.post(f"/console/operations/permits/{permit['permit_id']}/resolve",
                       data={"csrf": csrf, "as": "cancelled"})
    assert r.status_code == 403 and "read-only" in r.text
    api = await ops.post(f"/admin/v1/permits/{permit['permit_id']}/resolve",
                         json={"as": "cancelled"}, headers={"Authorization": f"Bearer {READ}"})
    assert api.status_code == 403
    assert (await _api(ops, "/admin/v1/permits", status="uncertain"))["data"] == [permit]


async def test_status_names_the_profile_generation_and_schema(ops: Client) -> None:
    """GET /admin/v1/status: the profile, the policy generation, the database's
    revision (the code's head in the shared profile; none locally), no backlog; the
    page shows the same and says there are no data planes in this profile."""
    status = await _api(ops, "/admin/v1/status")
    shared = status["profile"] == "shared"
    assert status["schema_revision"] == (list(code_heads()) if shared else None)
    assert status["settlement_backlog"] == 0 and status["data_planes"] is None
    await sign_in(ops, READ)
    page = await ops.get("/console/operations")
    generation = re.search(r'data-figure="policy_generation">(\d+)<', page.text)
    assert generation and int(generation.group(1)) == status["policy_generation"]
    assert f"no data planes in the {status['profile']} profile" in page.text
    if shared:
        assert f'data-figure="schema_revision">{code_heads()[0]}<' in page.text


async def test_alerts_fired_show_on_overview(ops: Client) -> None:
    """A cut stream's bound held as liability passes 80 % of a 1,400 µUSD team day
    (its bound is ~1,195 µUSD): the alert is listed by GET /admin/v1/alerts and on
    Overview, with its threshold and counter."""
    csrf = await sign_in(ops, WRITE)
    secret = await _team_key(ops, csrf, usd_micros_per_day="1400")
    await _call(ops, secret, CUT, stream=True)
    fired: list[dict[str, Any]] = []
    for _ in range(50):  # the alert check runs beside the request path (every 0.25 s)
        fired = (await _api(ops, "/admin/v1/alerts"))["data"]
        if any(a["scope"] == "team" for a in fired):
            break
        await asyncio.sleep(0.1)
    team = [a for a in fired if a["scope"] == "team"]
    assert team and team[0]["threshold"] >= 80 and team[0]["limit"] == 1400
    page = await ops.get("/console/overview")
    assert f'data-alert="{team[0]["id"]}"' in page.text
    bad = await ops.get("/admin/v1/alerts", params={"since": "2026-12-01T00:00:00"},
                        headers={"Authorization": f"Bearer {READ}"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"


async def test_a_key_holder_opens_only_its_own_requests(ops: Client) -> None:
    """A key's /v1/me/requests/{id} and its console page show its own request; another
    key's permit is a 404 to it, as an unknown one."""
    csrf = await sign_in(ops, WRITE)
    secret = await _team_key(ops, csrf)
    other = await ops.post("/console/keys", data={"csrf": csrf, "team": "platform"})
    found = SECRET.search(other.text)
    assert found
    await _call(ops, secret, "mock-gpt")
    await _call(ops, found.group(1), "mock-gpt")
    mine = (await _api(ops, "/v1/me/requests", token=secret))["data"][0]["permit_id"]
    theirs = (await _api(ops, "/v1/me/requests", token=found.group(1)))["data"][0]
    ops.cookies.clear()
    await sign_in(ops, secret)
    assert (await ops.get(f"/console/me/requests/{mine}")).status_code == 200
    for pid in (theirs["permit_id"], "no-such-permit"):
        r = await ops.get(f"/v1/me/requests/{pid}", headers={
            "Authorization": f"Bearer {secret}"})
        assert r.status_code == 404, r.text
        assert (await ops.get(f"/console/me/requests/{pid}")).status_code == 404
    listing = await ops.get("/console/me/requests")
    assert f'href="/console/me/requests/{mine}"' in listing.text
