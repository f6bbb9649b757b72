"""Publishing through inferplaned changes what running shared-mode gateways enforce.

Real processes: inferplaned and two ``mayu serve`` gateways in shared mode on one
migrated database, called with the real ``openai`` SDK. No gateway is restarted.
"""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from tests.e2e._controlplane import MODEL, SharedStack, budget_policy

pytestmark = pytest.mark.e2e


@pytest.fixture
def shared(two_gateways: SharedStack) -> SharedStack:
    return two_gateways


def call(client: openai.OpenAI) -> int:
    """One chat completion; its HTTP status (402 when a budget refuses it)."""
    try:
        client.chat.completions.create(model=MODEL, max_tokens=1000,
                                       messages=[{"role": "user", "content": "hi"}])
    except openai.APIStatusError as exc:
        return exc.status_code
    return 200


def wait_for_status(client: openai.OpenAI, status: int) -> int:
    """Call until ``status`` is answered; the statuses seen before (bounded, no timing)."""
    for _ in range(600):  # a hang guard, not a timing assertion
        got = call(client)
        if got == status:
            return got
        time.sleep(0.05)
    return got


def test_publish_and_delete_change_enforcement_without_restart(shared: SharedStack) -> None:
    """A published hard budget refuses (402) on every gateway; deleting it re-admits."""
    key = shared.team_key("e2e-team")
    clients = [openai.OpenAI(base_url=f"{g.url}/v1", api_key=key, max_retries=0)
               for g in shared.gateways]
    assert [call(c) for c in clients] == [200, 200]
    pids = [g.popen.pid for g in shared.gateways]

    r = shared.publish("e2e-budget", budget_policy("e2e-budget", "e2e-team", 1))
    assert r.status_code == 200, r.text
    assert [wait_for_status(c, 402) for c in clients] == [402, 402]

    assert shared.unpublish("e2e-budget").status_code == 200
    assert [wait_for_status(c, 200) for c in clients] == [200, 200]
    assert [g.popen.pid for g in shared.gateways] == pids
    assert all(g.popen.poll() is None for g in shared.gateways)
    changes = shared.control_get("/v1alpha1/changes")["changes"]
    assert [(c["name"], c["action"], c["author"]) for c in changes] == [
        ("e2e-budget", "put", "e2e"), ("e2e-budget", "delete", "e2e")]


def test_rejected_document_leaves_enforcement_alone(shared: SharedStack) -> None:
    """An invalid document is refused (422) and the gateways keep the published rules."""
    key = shared.team_key("e2e-keep")
    client = openai.OpenAI(base_url=f"{shared.gateways[0].url}/v1", api_key=key,
                           max_retries=0)
    assert shared.publish("keep", budget_policy("keep", "e2e-keep", 1)).status_code == 200
    assert wait_for_status(client, 402) == 402
    generation = shared.control_get("/v1alpha1/generation")["generation"]

    bad = budget_policy("keep", "e2e-keep", 1)
    bad["spec"]["rules"][0]["budget"]["unlimited"] = True  # contradicts limitMilliUSD
    r = shared.publish("keep", bad)
    assert r.status_code == 422
    assert {p["path"] for p in r.json()["error"]["problems"]} == {
        "keep:spec.rules[0].budget.limitMilliUSD", "keep:spec.rules[0].budget.hardCap"}
    assert shared.control_get("/v1alpha1/generation")["generation"] == generation
    assert call(client) == 402


def test_local_policy_files_hot_reload_in_a_running_gateway(tmp_path: Path) -> None:
    """Local profile: editing a policy file changes enforcement without restart; an
    invalid edit keeps the previous rules in force (all or nothing)."""
    import yaml

    from tests.e2e._controlplane import PRICE
    from tests.e2e._procs import create_key, create_team, start_gateway

    policies = tmp_path / "policies"
    policies.mkdir()
    config = tmp_path / "mayu.yaml"
    config.write_text(yaml.safe_dump({
        "data_dir": str(tmp_path / "data"), "demo": False,
        "policies": [str(policies / "*.yaml")],
        "providers": [{"name": "in-process", "kind": "mock"}],
        "models": [{"name": MODEL, "price": PRICE,
                    "deployments": [{"provider": "in-process"}]}]}))
    (policies / "team.yaml").write_text(yaml.safe_dump(budget_policy("team", "local", 10**6)))
    create_team(config, "local")
    key = create_key(config, "local")
    gateway = start_gateway(config)
    try:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
        assert call(client) == 200
        (policies / "team.yaml").write_text(yaml.safe_dump(budget_policy("team", "local", 1)))
        assert wait_for_status(client, 402) == 402
        broken = budget_policy("team", "local", 10**6)
        broken["spec"]["rules"][0]["budget"]["unlimited"] = True
        (policies / "team.yaml").write_text(yaml.safe_dump(broken))
        for _ in range(600):  # until the gateway has logged the rejection
            if "limitMilliUSD" in gateway.logs():
                break
            time.sleep(0.05)
        assert "spec.rules[0].budget.limitMilliUSD" in gateway.logs()
        assert call(client) == 402
        (policies / "team.yaml").unlink()
        assert wait_for_status(client, 200) == 200
    finally:
        gateway.stop()
