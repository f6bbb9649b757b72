"""A team's guardrail profiles edited after it was created (issue 39), on both key stores
(SQLite and Postgres) through the real app: set and cleared with a revision bump, an
unknown or malformed profile refused naming it, and the team's next request screened
with the new profiles — also on a replica holding a Principal cached before the edit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from msgspec.structs import replace

from gateway.app import create_app
from gateway.errors import BadRequest, RevisionConflict
from gateway.guardrails import GuardrailSettings
from gateway.keys import TeamLimits
from tests.integration._admin import WRITE, bearer, gateway_settings
from tests.integration._console import sign_in
from tests.integration._inapp import in_app

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

PROFILES = msgspec.convert({"profiles": {
    "block_secrets": {"actions": {"aws_key": "block", "generic_secret": "block"}},
    "masked": {"actions": {"email": "mask"}}}}, GuardrailSettings)
SECRET = "AKIA" + "Q3VJ7K2M5N6P4R6T"
"""A planted AWS access key id (its shape; no real key)."""
ASK: dict[str, Any] = {"model": "mock-gpt", "max_tokens": 8, "messages": [
    {"role": "user", "content": f"deploy with {SECRET} please"}]}


def _app(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         profile: str) -> Any:
    settings = gateway_settings(request, tmp_path, monkeypatch, profile=profile)
    return create_app(replace(settings, guardrails=PROFILES))


@pytest.mark.parametrize("profile", ["local", "shared"])
async def test_the_store_sets_and_clears_a_teams_profiles(
        request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        profile: str) -> None:
    """``update_team(guardrails=…)`` replaces the list and bumps the revision, keeping the
    limits; ``()`` clears it; limits alone keep the profiles; a malformed, duplicate or
    too long list and a stale revision are refused and change nothing."""
    app = _app(request, tmp_path, monkeypatch, profile)
    async with AsyncTestClient(app=app) as client:
        store = app.state.gateway.key_store
        team = in_app(client, store.create_team, name="t", limits=TeamLimits(rpm=5))
        assert team.guardrails == () and team.revision == 1
        set_ = in_app(client, store.update_team, "t", guardrails=("block_secrets", "masked"),
                      expected_revision=1)
        assert set_.guardrails == ("block_secrets", "masked")
        assert set_.revision == 2 and set_.limits == TeamLimits(rpm=5)
        read = in_app(client, store.get_team, team.id)
        assert read is not None and read.guardrails == ("block_secrets", "masked")
        limits = in_app(client, store.update_team, "t", limits=TeamLimits(rpm=9))
        assert limits.guardrails == ("block_secrets", "masked") and limits.revision == 3
        for bad in (("Not Ok",), ("masked", "masked"), tuple(f"p{i}" for i in range(17))):
            with pytest.raises(BadRequest, match="guardrails"):
                in_app(client, store.update_team, "t", guardrails=bad)
        with pytest.raises(BadRequest, match="give the limits or the guardrails"):
            in_app(client, store.update_team, "t")
        with pytest.raises(RevisionConflict):
            in_app(client, store.update_team, "t", guardrails=(), expected_revision=2)
        unchanged = in_app(client, store.get_team, "t")
        assert unchanged is not None and unchanged.revision == 3
        assert unchanged.guardrails == ("block_secrets", "masked")
        cleared = in_app(client, store.update_team, "t", guardrails=(), expected_revision=3)
        assert cleared.guardrails == () and cleared.revision == 4
        assert cleared.limits == TeamLimits(rpm=9)


def _audit(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("profile", ["local", "shared"])
async def test_admin_patch_changes_the_profiles_the_next_request_is_screened_with(
        request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        profile: str) -> None:
    """``PATCH /admin/v1/teams/{team}`` ``{"guardrails": ["block_secrets"]}``: the team's
    next request carrying a planted AWS key is a 400 naming the detector (never the
    key), ``[]`` lets it through again; an unknown profile is a 400 naming it and the
    configured ones, a stale If-Match a 412, neither changing the team; the console's
    team page shows the list; each edit is one audit line naming the token, the
    profiles before and after."""
    app = _app(request, tmp_path, monkeypatch, profile)
    async with AsyncTestClient(app=app) as c:
        w = bearer(WRITE)
        team = (await c.post("/admin/v1/teams", json={"name": "t"}, headers=w)).json()
        key = (await c.post("/admin/v1/keys", json={"team": "t"}, headers=w)).json()["secret"]
        assert (await c.post("/v1/chat/completions", json=ASK,
                             headers=bearer(key))).status_code == 200
        unknown = await c.patch("/admin/v1/teams/t", json={"guardrails": ["strict"]},
                                headers=w)
        assert unknown.status_code == 400, unknown.text
        assert unknown.json()["error"]["param"] == "guardrails"
        assert "'strict'" in unknown.text and "block_secrets, masked" in unknown.text
        stale = await c.patch("/admin/v1/teams/t", json={"guardrails": ["block_secrets"]},
                              headers={**w, "If-Match": '"7"'})
        assert stale.status_code == 412, stale.text
        assert (await c.get("/admin/v1/teams/t", headers=w)).json()["revision"] == 1

        done = await c.patch("/admin/v1/teams/t", json={"guardrails": ["block_secrets"]},
                             headers={**w, "If-Match": '"1"'})
        assert done.status_code == 200, done.text
        assert done.json()["guardrails"] == ["block_secrets"]
        assert done.json()["revision"] == 2 and done.headers["etag"] == '"2"'
        blocked = await c.post("/v1/chat/completions", json=ASK, headers=bearer(key))
        assert blocked.status_code == 400, blocked.text
        assert blocked.json()["error"]["code"] == "guardrail_blocked"
        assert "aws_key" in blocked.text and SECRET not in blocked.text
        c.follow_redirects = False  # as the console's own tests sign in
        await sign_in(c, WRITE)  # the console's team page shows the list
        page = await c.get(f"/console/teams/{team['id']}")
        assert page.status_code == 200
        assert re.search(r"data-team-guardrails>Guardrail profiles: block_secrets ",
                         page.text), page.text

        cleared = await c.patch("/admin/v1/teams/t", json={"guardrails": []}, headers=w)
        assert cleared.status_code == 200 and cleared.json()["guardrails"] == []
        assert cleared.json()["revision"] == 3
        assert (await c.post("/v1/chat/completions", json=ASK,
                             headers=bearer(key))).status_code == 200
    audit_path = tmp_path / "audit.jsonl"
    edits = [line for line in _audit(audit_path) if line.get("action") == "team.update"]
    assert [(e["token"], e["team_id"], e["guardrails_before"], e["guardrails"],
             e["revision"]) for e in edits] == [
        ("terraform", team["id"], [], ["block_secrets"], 2),
        ("terraform", team["id"], ["block_secrets"], [], 3)]
    assert SECRET not in audit_path.read_text() and WRITE not in audit_path.read_text()


async def test_a_principal_cached_before_the_edit_never_sends_the_request(
        request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Shared profile, a Principal cached for up to 5 s: after the team is edited in the
    store by someone else (``mayu teams set``, another replica's admin API), the next
    request — screened with the cached, unguarded team — is refused as a retryable 503
    ``snapshot_mismatch`` with its permit cancelled (nothing committed, nothing owed);
    the retry is screened with the new profile and blocked. A guarded team's key is not
    served from the cache, so the list cleared unblocks its very next request."""
    app = _app(request, tmp_path, monkeypatch, "shared")
    async with AsyncTestClient(app=app) as c:
        gw = app.state.gateway
        assert gw.resolver.principal_ttl_s > 0
        store = gw.key_store
        in_app(c, store.create_team, name="t")
        key = in_app(c, store.create_key, team="t")[0]
        assert (await c.post("/v1/chat/completions", json=ASK,
                             headers=bearer(key))).status_code == 200
        in_app(c, store.update_team, "t", guardrails=("block_secrets",))
        stale = await c.post("/v1/chat/completions", json=ASK, headers=bearer(key))
        assert stale.status_code == 503, stale.text
        assert stale.json()["error"]["code"] == "snapshot_mismatch"
        assert stale.headers["x-should-retry"] == "true"
        request_id = stale.headers["x-inferplane-request-id"]
        retry = await c.post("/v1/chat/completions", json=ASK, headers=bearer(key))
        assert retry.status_code == 400 and "aws_key" in retry.text
        in_app(c, store.update_team, "t", guardrails=())  # cleared: never blocks again
        assert (await c.post("/v1/chat/completions", json=ASK,
                             headers=bearer(key))).status_code == 200
    lines = [line for line in _audit(tmp_path / "audit.jsonl")
             if line.get("request_id") == request_id]
    assert [line["event"] for line in lines] == ["settled"]  # no dispatch line: never sent
    settled = lines[-1]
    assert settled["outcome"] == "cancelled"
    assert (settled["tokens_committed"], settled["usd_committed"],
            settled["tokens_liability"], settled["usd_liability"]) == (0, 0, 0, 0)


def test_mayu_teams_set_guardrails_sets_clears_and_names_an_unknown_profile(
        tmp_path: Path) -> None:
    """``mayu teams set NAME --guardrails a,b`` (a real subprocess on the local store)
    replaces the profiles and bumps the revision, keeping the limits; ``''`` clears them;
    an unknown profile exits 2 naming it and the configured ones, so does a malformed
    one, and neither changes the team."""
    config = tmp_path / "mayu.yaml"
    config.write_text("guardrails:\n  profiles:\n"
                      "    block_secrets: {actions: {aws_key: block}}\n"
                      "    masked: {actions: {email: mask}}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def mayu(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gateway", *args, "--config",
                               str(config)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
    assert mayu("teams", "create", "ml", "--rpm", "5").returncode == 0
    done = mayu("teams", "set", "ml", "--guardrails", "block_secrets,masked", "--json")
    assert done.returncode == 0, done.stderr
    team = json.loads(done.stdout)
    assert (team["guardrails"], team["revision"], team["limits"]["rpm"]) == (
        ["block_secrets", "masked"], 2, 5)
    unknown = mayu("teams", "set", "ml", "--guardrails", "strict")
    assert unknown.returncode == 2
    assert ("profile 'strict' is not configured (guardrails.profiles: block_secrets, "
            "masked)") in unknown.stderr
    malformed = mayu("teams", "set", "ml", "--guardrails", "Bad Name")
    assert malformed.returncode == 2 and "not a profile name" in malformed.stderr
    cleared = mayu("teams", "set", "ml", "--guardrails", "", "--json")
    assert cleared.returncode == 0, cleared.stderr
    assert (json.loads(cleared.stdout)["guardrails"], json.loads(cleared.stdout)["revision"]
            ) == ([], 3)
    listed = json.loads(mayu("teams", "list", "--json").stdout)
    assert [(t["name"], t["guardrails"], t["revision"]) for t in listed] == [("ml", [], 3)]
