"""The admin API (``/admin/v1``) on both profiles, through the real app factory.

Local (SQLite keys) and shared (a migrated Postgres) gateways with a write token
(``terraform``) and a read token (``portal``) configured by reference; Litestar's
in-process client. What an operator relies on: tiers hold, revisions guard writes,
keys never show their hash and their secret only once, lists page over everything,
every write is an audit line naming the token, and bad input is a 400 in OpenAI's shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from tests.integration._admin import READ, WRITE, bearer

pytestmark = pytest.mark.integration

BODY = {"model": "mock-gpt", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def _openai_error(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    error: dict[str, Any] = r.json()["error"]
    assert error["code"] == code and error["message"], error
    return error


async def test_tiers_a_read_token_reads_and_cannot_write(
        admin: tuple[AsyncTestClient[Any], Path]) -> None:
    """No token, a wrong one, or a virtual key: 401; the read token lists but every write
    is a 403 that changes nothing; the write token does both."""
    c, _ = admin
    for headers in ({}, bearer("nope-nope-nope-nope"), bearer(READ + "x")):
        _openai_error(await c.get("/admin/v1/teams", headers=headers), 401,
                      "invalid_api_key")
    assert (await c.get("/admin/v1/teams", headers=bearer(READ))).json()["data"] == []
    _openai_error(await c.post("/admin/v1/teams", json={"name": "t"},
                               headers=bearer(READ)), 403, "permission_denied")
    assert (await c.get("/admin/v1/teams", headers=bearer(READ))).json()["data"] == []
    r = await c.post("/admin/v1/teams", json={"name": "t"}, headers=bearer(WRITE))
    assert r.status_code == 201, r.text
    _openai_error(await c.post("/admin/v1/keys/" + "x" * 5 + "/revoke",
                               headers=bearer(READ)), 403, "permission_denied")
    created = await c.post("/admin/v1/keys", json={"team": "t"}, headers=bearer(WRITE))
    secret = created.json()["secret"]
    _openai_error(await c.get("/admin/v1/teams", headers=bearer(secret)), 401,
                  "invalid_api_key")


async def test_team_limits_are_guarded_by_their_revision(
        admin: tuple[AsyncTestClient[Any], Path]) -> None:
    """A team is created at revision 1 (ETag "1"); replacing its limits with If-Match "1"
    makes revision 2; the same stale If-Match again is a 412 that changes nothing; a
    malformed If-Match is a 400 naming the header; the team reads the same by name and
    by id."""
    c, _ = admin
    w = bearer(WRITE)
    r = await c.post("/admin/v1/teams", json={"name": "platform",
                                              "limits": {"usd_micros_per_day": 500}},
                     headers=w)
    assert r.status_code == 201 and r.headers["etag"] == '"1"', r.text
    team = r.json()
    assert team["limits"]["usd_micros_per_day"] == 500 and team["revision"] == 1
    new = {"usd_micros_per_day": 2_000_000, "rpm": 60}
    r = await c.put("/admin/v1/teams/platform/limits", json=new,
                    headers={**w, "If-Match": '"1"'})
    assert r.status_code == 200 and r.json()["revision"] == 2, r.text
    assert r.headers["etag"] == '"2"'
    r = await c.put("/admin/v1/teams/platform/limits", json={"usd_micros_per_day": 1},
                    headers={**w, "If-Match": '"1"'})
    error = _openai_error(r, 412, "revision_conflict")
    assert "revision 2, not 1" in error["message"]
    r = await c.put("/admin/v1/teams/platform/limits", json={"usd_micros_per_day": 1},
                    headers={**w, "If-Match": "yesterday"})
    assert _openai_error(r, 400, "invalid_request")["param"] == "If-Match"
    by_name = (await c.get("/admin/v1/teams/platform", headers=bearer(READ))).json()
    by_id = (await c.get(f"/admin/v1/teams/{team['id']}", headers=bearer(READ))).json()
    assert by_name == by_id and by_name["revision"] == 2
    assert by_name["limits"]["usd_micros_per_day"] == 2_000_000
    assert by_name["limits"]["rpm"] == 60
    _openai_error(await c.get("/admin/v1/teams/nope", headers=bearer(READ)), 404,
                  "not_found")


async def test_a_key_is_shown_once_works_pages_and_is_revoked(
        admin: tuple[AsyncTestClient[Any], Path]) -> None:
    """Five keys: each create answers its secret once (no-store), which then calls the
    gateway; no answer carries a hash; pages of 2 walk all five in id order; filters by
    user and status; a revoked key is a 401 at once and stays listed as revoked."""
    c, _ = admin
    w, rd = bearer(WRITE), bearer(READ)
    assert (await c.post("/admin/v1/teams", json={"name": "t"}, headers=w)).status_code == 201
    created = []
    for i in range(5):
        r = await c.post("/admin/v1/keys", json={"team": "t", "name": f"k{i}",
                                                 "user": "ana" if i < 2 else None,
                                                 "limits": {"rpm": 100}}, headers=w)
        assert r.status_code == 201 and r.headers["cache-control"] == "no-store", r.text
        body = r.json()
        assert body["secret"].startswith(body["key"]["display_prefix"])
        assert "key_hash" not in json.dumps(body)
        created.append(body)
    secret, key_id = created[0]["secret"], created[0]["key"]["key_id"]
    r = await c.post("/v1/chat/completions", json=BODY, headers=bearer(secret))
    assert r.status_code == 200, r.text

    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await c.get("/admin/v1/keys", params=params, headers=rd)).json()
        assert len(page["data"]) <= 2
        seen += [k["key_id"] for k in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(k["key"]["key_id"] for k in created)
    listed = (await c.get("/admin/v1/keys", headers=rd)).text
    assert "secret" not in listed and "key_hash" not in listed
    ana = (await c.get("/admin/v1/keys", params={"user": "ana"}, headers=rd)).json()
    assert len(ana["data"]) == 2

    r = await c.post(f"/admin/v1/keys/{key_id}/revoke", headers={**w, "If-Match": '"1"'})
    assert r.status_code == 200 and r.json()["status"] == "revoked", r.text
    _openai_error(await c.post("/v1/chat/completions", json=BODY, headers=bearer(secret)),
                  401, "invalid_api_key")
    revoked = (await c.get("/admin/v1/keys", params={"status": "revoked"},
                           headers=rd)).json()["data"]
    assert [k["key_id"] for k in revoked] == [key_id]
    active = (await c.get("/admin/v1/keys", params={"status": "active"},
                          headers=rd)).json()["data"]
    assert len(active) == 4
    _openai_error(await c.get("/admin/v1/keys", params={"cursor": "%%%"}, headers=rd),
                  400, "invalid_request")


async def test_a_key_revokes_itself(admin: tuple[AsyncTestClient[Any], Path]) -> None:
    """Whoever holds a leaked key can kill it: POST /v1/me/revoke with the key answers
    it revoked, and the key is a 401 from then on (a second call too)."""
    c, audit = admin
    await c.post("/admin/v1/teams", json={"name": "t"}, headers=bearer(WRITE))
    secret = (await c.post("/admin/v1/keys", json={"team": "t"},
                           headers=bearer(WRITE))).json()["secret"]
    r = await c.post("/v1/me/revoke", headers=bearer(secret))
    assert r.status_code == 200 and r.json()["status"] == "revoked", r.text
    for path in ("/v1/me/revoke", "/v1/me"):
        method = c.post if path.endswith("revoke") else c.get
        _openai_error(await method(path, headers=bearer(secret)), 401, "invalid_api_key")
    actions = [json.loads(line)["action"] for line in audit.read_text().splitlines()
               if '"event":"admin"' in line.replace(" ", "")]
    assert actions == ["team.create", "key.create", "key.revoke_self"]


async def test_bad_input_is_a_400_in_openais_shape_and_every_write_is_audited(
        admin: tuple[AsyncTestClient[Any], Path]) -> None:
    """A wrong type, an unknown field, a negative or absurd limit, malformed JSON, a
    huge page size: 400 naming the problem, nothing created. The audit file has one
    line per accepted write, naming the token, and never a secret."""
    c, audit = admin
    w = bearer(WRITE)
    cases = [({"name": 5}, "name"), ({"name": "t", "colour": "red"}, None),
             ({"name": "t", "limits": {"rpm": -1}}, None),
             ({"name": "t", "limits": {"usd_micros_per_day": 10**30}}, None),
             ({"name": ""}, "name")]
    for body, param in cases:
        error = _openai_error(await c.post("/admin/v1/teams", json=body, headers=w), 400,
                              "invalid_request")
        if param:
            assert error["param"] == param, (body, error)
    r = await c.post("/admin/v1/teams", content=b'{"name": ', headers={
        **w, "content-type": "application/json"})
    _openai_error(r, 400, "invalid_request")
    _openai_error(await c.get("/admin/v1/teams", params={"limit": 10**6},
                              headers=w), 400, "invalid_request")
    assert (await c.get("/admin/v1/teams", headers=w)).json()["data"] == []

    await c.post("/admin/v1/teams", json={"name": "t"}, headers=w)
    created = (await c.post("/admin/v1/keys", json={"team": "t"}, headers=w)).json()
    await c.put("/admin/v1/teams/t/limits", json={"rpm": 5}, headers=w)
    lines = [json.loads(x) for x in audit.read_text().splitlines()]
    admin_lines = [x for x in lines if x.get("event") == "admin"]
    assert [(x["action"], x["token"]) for x in admin_lines] == [
        ("team.create", "terraform"), ("key.create", "terraform"),
        ("team.limits", "terraform")]
    text = audit.read_text()
    assert created["secret"] not in text and WRITE not in text and READ not in text


async def test_rotation_keeps_the_key_and_the_old_secret_works_for_its_grace(
        admin: tuple[AsyncTestClient[Any], Path]) -> None:
    """A rotation answers a new secret for the same key_id (revision + 1, same limits):
    the new secret works at once and the old one until previous_valid_until, then is a
    401. Ten concurrent retries with one Idempotency-Key rotate once and all answer the
    same secret. grace_seconds 0 ends the old secret at once; a revoked key cannot be
    rotated (409); the audit line carries no secret."""
    import asyncio
    from datetime import UTC, datetime

    c, audit = admin
    w = bearer(WRITE)
    await c.post("/admin/v1/teams", json={"name": "t"}, headers=w)
    made = (await c.post("/admin/v1/keys", json={"team": "t", "limits": {"rpm": 50}},
                         headers=w)).json()
    old, key_id = made["secret"], made["key"]["key_id"]

    async def rotate(idem: str, grace: int) -> Any:
        return await c.post(f"/admin/v1/keys/{key_id}/rotate",
                            json={"grace_seconds": grace},
                            headers={**w, "Idempotency-Key": idem})

    answers = await asyncio.gather(*(rotate("rotation-1", 1) for _ in range(10)))
    assert {r.status_code for r in answers} == {200}, [r.text for r in answers]
    bodies = [r.json() for r in answers]
    assert len({b["secret"] for b in bodies}) == 1
    assert sum(not b["replayed"] for b in bodies) == 1
    new = bodies[0]["secret"]
    assert new != old and bodies[0]["key"]["key_id"] == key_id
    current = (await c.get(f"/admin/v1/keys/{key_id}", headers=w)).json()
    assert current["revision"] == 2 and current["limits"]["rpm"] == 50
    assert current["display_prefix"] == new[:len(current["display_prefix"])]
    for secret in (new, old):
        r = await c.post("/v1/chat/completions", json=BODY, headers=bearer(secret))
        assert r.status_code == 200, r.text
    until = datetime.fromisoformat(bodies[0]["previous_valid_until"].replace("Z", "+00:00"))
    while datetime.now(UTC) <= until:  # the grace is one second
        await asyncio.sleep(0.05)
    _openai_error(await c.post("/v1/chat/completions", json=BODY, headers=bearer(old)),
                  401, "invalid_api_key")
    assert (await c.post("/v1/chat/completions", json=BODY,
                         headers=bearer(new))).status_code == 200
    again = await rotate("rotation-1", 1)  # a late retry still answers the same secret
    assert again.json()["secret"] == new and again.json()["replayed"] is True

    third = (await rotate("rotation-2", 0)).json()
    _openai_error(await c.post("/v1/chat/completions", json=BODY, headers=bearer(new)),
                  401, "invalid_api_key")
    assert third["key"]["revision"] == 3
    await c.post(f"/admin/v1/keys/{key_id}/revoke", headers=w)
    _openai_error(await rotate("rotation-3", 0), 409, "key_revoked")
    _openai_error(await c.post(f"/admin/v1/keys/{key_id}/rotate",
                               json={"grace_seconds": -1}, headers=w), 400,
                  "invalid_request")
    text = audit.read_text()
    assert [json.loads(x)["action"] for x in text.splitlines()
            if '"key.rotate"' in x] == ["key.rotate", "key.rotate"]
    assert new not in text and third["secret"] not in text


async def test_the_request_log_pages_filters_sums_and_exports(
        admin: tuple[AsyncTestClient[Any], Path]) -> None:
    """Ten requests from three keys of two teams: the log lists them newest first and
    pages of 3 walk all ten; filters by team, key and model; the day summary of team t
    equals /v1/usage and the counters (/v1/me) to the µUSD; the CSV has the JSON's rows;
    a key's own log (/v1/me/requests) is its requests only; no token is a 401."""
    import csv
    import io

    c, _ = admin
    w, rd = bearer(WRITE), bearer(READ)
    await c.post("/admin/v1/teams", json={"name": "t", "limits": {
        "usd_micros_per_day": 10**9}}, headers=w)
    await c.post("/admin/v1/teams", json={"name": "u"}, headers=w)
    a = (await c.post("/admin/v1/keys", json={"team": "t", "user": "ana"},
                      headers=w)).json()
    b = (await c.post("/admin/v1/keys", json={"team": "t", "user": "bob"},
                      headers=w)).json()
    u = (await c.post("/admin/v1/keys", json={"team": "u"}, headers=w)).json()
    plan = [(a, "mock-gpt")] * 5 + [(b, "mock-claude")] * 3 + [(u, "mock-gpt")] * 2
    for i, (key, model) in enumerate(plan):
        r = await c.post("/v1/chat/completions", headers=bearer(key["secret"]), json={
            "model": model, "max_tokens": 4 + i,
            "messages": [{"role": "user", "content": "hi " * (i + 1)}]})
        assert r.status_code == 200, r.text

    seen: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = (await c.get("/admin/v1/requests", params=params, headers=rd)).json()
        seen += page["data"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 10 and len({r["permit_id"] for r in seen}) == 10
    assert [r["created_at"] for r in seen] == sorted((r["created_at"] for r in seen),
                                                     reverse=True)
    assert all(r["status"] == "complete" and r["usd_committed"] > 0 for r in seen)

    async def count(**params: str) -> int:
        page = (await c.get("/admin/v1/requests", params=params, headers=rd)).json()
        return len(page["data"])

    assert await count(team="t") == 8 and await count(team="u") == 2
    assert await count(key_id=a["key"]["key_id"]) == 5
    assert await count(model="mock-claude") == 3
    assert await count(user="bob") == 3 and await count(status="pending") == 0

    summary = (await c.get("/admin/v1/requests/summary", params={
        "group_by": "team", "bucket": "day", "team": "t"}, headers=rd)).json()["data"]
    assert len(summary) == 1 and summary[0]["requests"] == 8
    usage = (await c.get("/v1/usage", headers=bearer(a["secret"]))).json()["data"]
    team_day = next(x for x in usage if x["scope"] == "team" and x["window"] == "day")
    assert summary[0]["usd_committed"] == team_day["usd_committed"]
    assert summary[0]["tokens_committed"] == team_day["tokens_committed"]
    assert summary[0]["usd_committed"] == sum(r["usd_committed"] for r in seen
                                              if r["team_id"] == a["key"]["team_id"])
    me = (await c.get("/v1/me", headers=bearer(a["secret"]))).json()["limits"]
    counter = next(x for x in me if x["owner"] == "team" and x["window"] == "day")
    assert counter["committed"] == summary[0]["usd_committed"]
    by_model = (await c.get("/admin/v1/requests/summary", params={
        "group_by": "team,model", "bucket": "none"}, headers=rd)).json()["data"]
    assert sorted((x["model"], x["requests"]) for x in by_model) == [
        ("mock-claude", 3), ("mock-gpt", 2), ("mock-gpt", 5)]

    exported = (await c.get("/admin/v1/requests.csv", headers=rd))
    assert exported.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert [r["permit_id"] for r in rows] == [r["permit_id"] for r in seen]
    for got, want in zip(rows, seen, strict=True):
        assert int(got["usd_committed"]) == want["usd_committed"]
        assert got["user"] == (want["user"] or "")

    own = (await c.get("/v1/me/requests", params={"team": "u"},
                       headers=bearer(b["secret"]))).json()["data"]
    assert {r["key_id"] for r in own} == {b["key"]["key_id"]} and len(own) == 3
    _openai_error(await c.get("/admin/v1/requests"), 401, "invalid_api_key")
    _openai_error(await c.get("/admin/v1/requests", headers=bearer(b["secret"])), 401,
                  "invalid_api_key")


async def test_a_key_is_edited_field_by_field_and_binds_at_the_next_request(
        admin: tuple[AsyncTestClient[Any], Path]) -> None:
    """PATCH changes only the fields given (revision + 1, same id and secret); a model
    removed from allowed_models is refused at the next request (403) and the new key
    limits hold (rpm 1: the second request is a 429); null clears; a stale If-Match is a
    412 that changes nothing; a misspelt field is a 400; a revoked key cannot be
    edited."""
    c, _ = admin
    w = bearer(WRITE)
    await c.post("/admin/v1/teams", json={"name": "t"}, headers=w)
    made = (await c.post("/admin/v1/keys", json={"team": "t", "name": "laptop",
                                                 "user": "ana"}, headers=w)).json()
    key_id, secret = made["key"]["key_id"], made["secret"]
    assert (await c.post("/v1/chat/completions", json=BODY,
                         headers=bearer(secret))).status_code == 200
    r = await c.patch(f"/admin/v1/keys/{key_id}", headers={**w, "If-Match": '"1"'}, json={
        "allowed_models": ["mock-claude"], "limits": {"rpm": 1}})
    assert r.status_code == 200, r.text
    edited = r.json()
    assert edited["revision"] == 2 and edited["name"] == "laptop" and edited["user"] == "ana"
    assert edited["allowed_models"] == ["mock-claude"] and edited["limits"]["rpm"] == 1
    assert (await c.post("/v1/chat/completions", json=BODY,
                         headers=bearer(secret))).status_code == 403
    claude = {**BODY, "model": "mock-claude"}
    statuses = [(await c.post("/v1/chat/completions", json=claude,
                              headers=bearer(secret))).status_code for _ in range(2)]
    assert statuses == [200, 429]
    _openai_error(await c.patch(f"/admin/v1/keys/{key_id}", json={"name": "x"},
                                headers={**w, "If-Match": '"1"'}), 412, "revision_conflict")
    _openai_error(await c.patch(f"/admin/v1/keys/{key_id}", json={"rpm": 5}, headers=w),
                  400, "invalid_request")
    r = await c.patch(f"/admin/v1/keys/{key_id}", json={"user": None,
                                                       "allowed_models": None}, headers=w)
    assert r.status_code == 200 and r.json()["user"] is None
    assert r.json()["allowed_models"] is None and r.json()["name"] == "laptop"
    await c.post(f"/admin/v1/keys/{key_id}/revoke", headers=w)
    _openai_error(await c.patch(f"/admin/v1/keys/{key_id}", json={"name": "y"}, headers=w),
                  409, "key_revoked")
