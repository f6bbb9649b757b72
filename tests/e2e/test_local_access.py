"""Who sees what, and the refusals a running gateway gives: /v1/usage scopes, 403, 429."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e._procs import create_key, create_team, run_cli
from tests.e2e.conftest import ADMIN_TOKEN, Stack

pytestmark = pytest.mark.e2e

HI = {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def _chat(stack: Stack, key: str, model: str = "gpt-local") -> httpx.Response:
    return httpx.post(f"{stack.gateway.url}/v1/chat/completions", json={"model": model, **HI},
                      headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_usage_report_scopes_key_team_and_admin(stack: Stack) -> None:
    """A key sees its own key and team rows only; the admin token sees every team."""
    a, b = stack.team_key("scope-a"), stack.team_key("scope-b")
    assert _chat(stack, a).status_code == 200 and _chat(stack, b).status_code == 200
    seen_by_a = stack.usage(a)
    assert {scope for scope, _ in seen_by_a} == {"key", "team"}
    team_ids = {row["id"] for (scope, _), row in seen_by_a.items() if scope == "team"}
    assert len(team_ids) == 1
    admin = httpx.get(f"{stack.gateway.url}/v1/usage",
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    admin_teams = {row["id"] for row in admin["data"] if row["scope"] == "team"}
    assert team_ids < admin_teams and len(admin_teams) >= 2
    nobody = httpx.get(f"{stack.gateway.url}/v1/usage",
                       headers={"Authorization": "Bearer wrong-admin-token"})
    assert nobody.status_code == 401


def test_model_outside_allowed_models_is_403(stack: Stack) -> None:
    """A key limited to some models gets 403 for others, before any admission."""
    create_team(stack.config, "restricted")
    key = create_key(stack.config, "restricted", "--models", "gpt-local")
    assert _chat(stack, key).status_code == 200
    r = _chat(stack, key, "gpt-up")
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_not_allowed"
    assert stack.team_usage(key)["requests"] == 1


def test_rate_limit_is_429_with_retry_after(stack: Stack) -> None:
    """Past the team's RPM: 429 in the OpenAI shape with a Retry-After header."""
    key = stack.team_key("rpm-one", "--rpm", "1")
    assert _chat(stack, key).status_code == 200
    r = _chat(stack, key)
    assert r.status_code == 429
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["type"] == "rate_limit_error"
    m = httpx.post(f"{stack.gateway.url}/v1/messages", json={"model": "claude-local", **HI},
                   headers={"x-api-key": key}, timeout=30)
    assert m.status_code == 429 and m.json()["error"]["type"] == "rate_limit_error"


def test_metrics_health_and_readiness(stack: Stack) -> None:
    """/metrics exposes admissions and µUSD counters; /healthz and /readyz answer 200."""
    assert _chat(stack, stack.team_key("metrics")).status_code == 200
    text = httpx.get(f"{stack.gateway.url}/metrics").text
    assert 'mayu_admissions_total{outcome="admitted"}' in text
    assert "mayu_committed_micro_usd_total" in text and "mayu_upstream_seconds_bucket" in text
    assert httpx.get(f"{stack.gateway.url}/healthz").status_code == 200
    assert httpx.get(f"{stack.gateway.url}/readyz").status_code == 200


def test_key_revoked_or_team_edited_while_serving_binds_at_the_next_request(
        stack: Stack) -> None:
    """The gateway keeps a key's Principal for its next requests; a revocation or a team
    edit made meanwhile with the CLI still binds the very next request (admission
    re-checks both under its write lock), with no upstream call."""
    key = stack.team_key("kept-principal")
    assert _chat(stack, key).status_code == 200
    done = run_cli("teams", "set", "kept-principal", "--config", str(stack.config),
                   "--tokens-per-day", "1")
    assert done.returncode == 0, done.stderr
    stack.clear_ledger()
    assert _chat(stack, key).status_code == 429
    listed = run_cli("keys", "list", "--team", "kept-principal", "--config",
                     str(stack.config), "--json")
    assert listed.returncode == 0, listed.stderr
    [record] = json.loads(listed.stdout)
    done = run_cli("keys", "revoke", record["id"], "--config", str(stack.config))
    assert done.returncode == 0, done.stderr
    assert _chat(stack, key).status_code == 401
    assert stack.ledger() == []
