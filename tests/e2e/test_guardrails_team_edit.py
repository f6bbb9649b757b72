"""A team's guardrail profiles changed after it was created, against two real shared-
profile replicas (``mayu serve`` on one Postgres) in front of ``mayu mock-upstream``.

A team created without guardrails sends a planted AWS key through both replicas; the
operator runs ``mayu teams set payments --guardrails block_secrets`` (a real process,
neither replica told); the next request on either replica — each holding the team's
Principal cached from a moment before — is blocked in the client's own shape, nothing
reaches the upstream (its ledger) and nothing is charged; ``--guardrails ''`` lets the
team's requests through again.
"""

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

from tests.e2e._procs import (
    Proc,
    create_key,
    create_team,
    run_cli,
    shared_replicas,
    shared_stores,
    wait_none_pending,
)

pytestmark = pytest.mark.e2e

SECRET = "AKIA" + "Q3VJ7K2M5N6P4R6T"
"""A planted AWS access key id (its shape; no real key)."""
PROMPT = f"Deploy the stack with access key {SECRET} today."
PRICE = {"input": 1_000_000, "output": 4_000_000}


@dataclass
class Replicas:
    gateways: list[Proc]
    upstream: Proc
    config: Path
    env: dict[str, str]
    dsn: str
    team_id: str
    key: str

    def ledger(self) -> int:
        entries: list[Any] = httpx.get(f"{self.upstream.url}/__mock/ledger").json()
        return len(entries)

    def team_day(self) -> dict[str, Any]:
        """The team's committed, owed and reserved figures of today (``/v1/usage``)."""
        wait_none_pending(self.dsn, team_id=self.team_id)
        r = httpx.get(f"{self.gateways[0].url}/v1/usage",
                      headers={"Authorization": f"Bearer {self.key}"}, timeout=30)
        r.raise_for_status()
        row = next((x for x in r.json()["data"]
                    if (x["scope"], x["window"]) == ("team", "day")), {})
        return {f: row.get(f, 0) for f in ("tokens_committed", "usd_committed",
                                           "tokens_liability", "usd_liability",
                                           "tokens_reserved", "usd_reserved")}

    def set_guardrails(self, value: str) -> dict[str, Any]:
        done = run_cli("teams", "set", "payments", "--guardrails", value, "--config",
                       str(self.config), "--json", env=self.env)
        assert done.returncode == 0, done.stderr
        team: dict[str, Any] = json.loads(done.stdout)
        return team


def _config(workdir: Path, upstream: Proc, replica: int) -> Path:
    config = workdir / f"mayu-{replica}.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(workdir / f"data-{replica}"), "demo": False,
        "server": {"replica_id": f"r{replica}"}, **shared_stores(),
        "providers": [
            {"name": "up", "kind": "openai", "base_url": f"{upstream.url}/v1",
             "timeout_s": 60},
            {"name": "an", "kind": "anthropic", "base_url": upstream.url,
             "timeout_s": 60}],
        "models": [
            {"name": "gpt-up", "price": PRICE, "deployments": [
                {"provider": "up", "upstream_model": "mock-gpt"}]},
            {"name": "claude-up", "price": PRICE, "deployments": [
                {"provider": "an", "upstream_model": "mock-claude"}]}],
        "guardrails": {"profiles": {"block_secrets": {"actions": {
            "aws_key": "block", "generic_secret": "block"}}}}}))
    return config


@pytest.fixture(scope="module")
def r(pg_module_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    workdir = tmp_path_factory.mktemp("guard-edit")
    env = {"INFERPLANE_DATABASE_URL": pg_module_dsn}
    with shared_replicas(workdir, _config, (1, 2), env=env) as (upstream, gateways, configs):
        team = create_team(configs[0], "payments", env=env)
        assert team["guardrails"] == []
        key = create_key(configs[0], "payments", env=env)
        yield Replicas(gateways, upstream, configs[0], env, pg_module_dsn, team["id"], key)


def _ask(r: Replicas, gateway: Proc) -> openai.types.chat.ChatCompletion:
    # The SDK's own retries (2) stand: a request screened under a Principal cached
    # before the edit is a retryable 503 snapshot_mismatch, never sent upstream.
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=r.key, max_retries=2)
    return client.chat.completions.create(
        model="gpt-up", max_tokens=16, messages=[{"role": "user", "content": PROMPT}])


def test_profiles_set_by_the_cli_block_the_next_request_on_every_replica(
        r: Replicas) -> None:
    """Unguarded, the planted key goes through both replicas; after ``mayu teams set
    --guardrails block_secrets`` (revision 2), each replica's next request is a 400
    ``guardrail_blocked`` naming ``aws_key`` and never the key, the upstream's ledger
    gains nothing and the team's committed, owed and reserved figures do not move."""
    for gateway in r.gateways:  # each replica now holds the team's Principal cached
        assert _ask(r, gateway).choices[0].message.content
    before, sent = r.team_day(), r.ledger()
    assert sent == 2 and before["usd_committed"] > 0

    team = r.set_guardrails("block_secrets")
    assert (team["guardrails"], team["revision"]) == (["block_secrets"], 2)
    for gateway in r.gateways:
        with pytest.raises(openai.BadRequestError) as refused:
            _ask(r, gateway)
        assert refused.value.status_code == 400
        body = refused.value.body
        assert isinstance(body, dict) and body["code"] == "guardrail_blocked", body
        assert "aws_key" in body["message"] and SECRET not in refused.value.response.text
    claude = anthropic.Anthropic(base_url=r.gateways[1].url, api_key=r.key, max_retries=2)
    with pytest.raises(anthropic.BadRequestError) as refused_claude:
        claude.messages.create(model="claude-up", max_tokens=16,
                               messages=[{"role": "user", "content": PROMPT}])
    assert refused_claude.value.response.json()["type"] == "error"  # Anthropic's shape
    assert SECRET not in refused_claude.value.response.text
    assert r.ledger() == sent
    assert r.team_day() == before


def test_profiles_cleared_let_the_team_through_again(r: Replicas) -> None:
    """``mayu teams set payments --guardrails ''`` clears the list (revision 3); both
    replicas serve the team's next request again and the upstream records each."""
    team = r.set_guardrails("")
    assert (team["guardrails"], team["revision"]) == ([], 3)
    sent = r.ledger()
    for gateway in r.gateways:
        assert _ask(r, gateway).choices[0].message.content
    assert r.ledger() == sent + 2


def test_no_gateway_file_holds_the_planted_key(r: Replicas) -> None:
    """The replicas' data dirs (audit, journal) and logs never hold the planted key (the
    refusals named the detector only)."""
    workdir = r.config.parent
    files = [p for p in workdir.rglob("*") if p.is_file()
             and not p.name.startswith("mock-upstream")]
    assert any(p.name.startswith("audit") for p in files)
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
