"""inferplaned's HTTP API against a real migrated Postgres (Litestar test client)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml
from litestar.testing import AsyncTestClient

from controlplane import create_app
from tests.integration._inferplaned import control_plane_config

pytestmark = pytest.mark.integration

WRITER = "w" * 8 + "-writer-token-1"
OTHER_WRITER = "o" * 8 + "-writer-token-2"
READER = "r" * 8 + "-reader-token-1"


def doc(name: str, rpm: int = 60, *, uid: str | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"name": "rate", "subject": {"kind": "team", "team": "platform"},
                            "failurePolicy": "FailOpen", "rate": {"rpm": rpm}}
    if uid:
        rule["uid"] = uid
    return {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
            "metadata": {"name": name}, "spec": {"rules": [rule]}}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def client(pg_dsn: str, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[AsyncTestClient[Any]]:
    config = control_plane_config(monkeypatch, pg_dsn,
                                  writers={"ci": WRITER, "alice": OTHER_WRITER},
                                  readers={"dashboards": READER})
    async with AsyncTestClient(app=create_app(config)) as c:
        yield c


async def generation_of(client: AsyncTestClient[Any]) -> int:
    r = await client.get("/v1alpha1/generation", headers=bearer(READER))
    assert r.status_code == 200
    return int(r.json()["generation"])


async def test_writer_publishes_yaml_and_json_as_new_generations(
        client: AsyncTestClient[Any]) -> None:
    """Each accepted PUT (YAML or JSON body) is a new generation readers can see."""
    before = await generation_of(client)
    r = await client.put("/v1alpha1/policies/team-a", content=yaml.safe_dump(doc("team-a")),
                         headers={**bearer(WRITER), "Content-Type": "application/yaml"})
    assert r.status_code == 200, r.text
    assert r.json()["generation"] == before + 1 and r.json()["author"] == "ci"
    r = await client.put("/v1alpha1/policies/team-b", json=doc("team-b"), headers=bearer(WRITER))
    assert r.status_code == 200 and r.json()["generation"] == before + 2
    got = await client.get("/v1alpha1/policies/team-a", headers=bearer(READER))
    assert got.status_code == 200 and got.json() == doc("team-a")
    listed = (await client.get("/v1alpha1/policies", headers=bearer(READER))).json()
    assert [d["metadata"]["name"] for d in listed["items"]] == ["team-a", "team-b"]
    assert listed["generation"] == before + 2 and len(listed["fingerprint"]) == 64


async def test_reader_cannot_publish(client: AsyncTestClient[Any]) -> None:
    """A reader token gets 403 on PUT and DELETE, and nothing is published."""
    before = await generation_of(client)
    r = await client.put("/v1alpha1/policies/x", json=doc("x"), headers=bearer(READER))
    assert r.status_code == 403 and "reader" in r.json()["error"]["message"]
    r = await client.delete("/v1alpha1/policies/x", headers=bearer(READER))
    assert r.status_code == 403
    assert await generation_of(client) == before


@pytest.mark.parametrize("headers", [{}, bearer("not-a-configured-token-at-all"),
                                     {"Authorization": WRITER}])
async def test_missing_or_unknown_token_is_401(client: AsyncTestClient[Any],
                                               headers: dict[str, str]) -> None:
    """No token, an unknown token, or a non-Bearer header is 401 on reads and writes."""
    r = await client.put("/v1alpha1/policies/x", json=doc("x"), headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert (await client.get("/v1alpha1/policies", headers=headers)).status_code == 401
    assert (await client.get("/v1alpha1/changes", headers=headers)).status_code == 401


async def test_invalid_document_is_422_with_paths_and_disturbs_nothing(
        client: AsyncTestClient[Any]) -> None:
    """An invalid document → 422 listing every problem with its path; generation kept."""
    ok = await client.put("/v1alpha1/policies/keep", json=doc("keep"), headers=bearer(WRITER))
    before = await generation_of(client)
    bad = doc("keep", rpm=0)
    bad["spec"]["rules"][0]["budget"] = {"unlimited": True, "limitMilliUSD": 5}
    r = await client.put("/v1alpha1/policies/keep", json=bad, headers=bearer(WRITER))
    assert ok.status_code == 200 and r.status_code == 422
    paths = {p["path"] for p in r.json()["error"]["problems"]}
    assert paths == {"keep:spec.rules[0].rate.rpm", "keep:spec.rules[0].budget.limitMilliUSD",
                     "keep:spec.rules[0]"}
    assert await generation_of(client) == before
    still = await client.get("/v1alpha1/policies/keep", headers=bearer(READER))
    assert still.json() == doc("keep")


async def test_name_must_match_metadata_name(client: AsyncTestClient[Any]) -> None:
    """PUT /policies/a with metadata.name b is refused at metadata.name."""
    r = await client.put("/v1alpha1/policies/a", json=doc("b"), headers=bearer(WRITER))
    assert r.status_code == 422
    assert [p["path"] for p in r.json()["error"]["problems"]] == ["a:metadata.name"]


async def test_conflict_with_published_set_is_422(client: AsyncTestClient[Any]) -> None:
    """A document valid alone but clashing with the published set (uid) is refused."""
    await client.put("/v1alpha1/policies/a", json=doc("a", uid="shared"), headers=bearer(WRITER))
    before = await generation_of(client)
    r = await client.put("/v1alpha1/policies/b", json=doc("b", uid="shared"),
                         headers=bearer(WRITER))
    assert r.status_code == 422
    assert any("duplicate rule uid" in p["message"] for p in r.json()["error"]["problems"])
    assert await generation_of(client) == before


async def test_malformed_body_is_400(client: AsyncTestClient[Any]) -> None:
    """A body that is not a JSON/YAML mapping is a 400 in the JSON error shape."""
    r = await client.put("/v1alpha1/policies/a", content=b"[1, 2",
                         headers={**bearer(WRITER), "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("body:")


async def test_changes_attribute_every_write(client: AsyncTestClient[Any]) -> None:
    """/v1alpha1/changes records who changed which policy, how, and in which generation."""
    start = await generation_of(client)
    await client.put("/v1alpha1/policies/a", json=doc("a"), headers=bearer(WRITER))
    await client.put("/v1alpha1/policies/a", json=doc("a", rpm=5), headers=bearer(OTHER_WRITER))
    d = await client.delete("/v1alpha1/policies/a", headers=bearer(OTHER_WRITER))
    assert d.status_code == 200
    r = await client.get("/v1alpha1/changes", params={"since": start}, headers=bearer(READER))
    changes = r.json()["changes"]
    assert [(c["generation"], c["name"], c["action"], c["author"]) for c in changes] == [
        (start + 1, "a", "put", "ci"), (start + 2, "a", "put", "alice"),
        (start + 3, "a", "delete", "alice")]
    assert changes[1]["before"]["spec"]["rules"][0]["rate"]["rpm"] == 60
    assert changes[1]["after"]["spec"]["rules"][0]["rate"]["rpm"] == 5
    assert all(c["at"] for c in changes)
    later = await client.get("/v1alpha1/changes", params={"since": start + 2},
                             headers=bearer(READER))
    assert [c["action"] for c in later.json()["changes"]] == ["delete"]


async def test_delete_and_get_unknown_are_404(client: AsyncTestClient[Any]) -> None:
    """GET or DELETE of a policy that is not published is 404; the generation stays."""
    before = await generation_of(client)
    assert (await client.get("/v1alpha1/policies/none", headers=bearer(READER))
            ).status_code == 404
    assert (await client.delete("/v1alpha1/policies/none", headers=bearer(WRITER))
            ).status_code == 404
    assert await generation_of(client) == before


async def test_health_and_readiness(client: AsyncTestClient[Any]) -> None:
    """/healthz and /readyz answer without a token; readyz checks the database."""
    assert (await client.get("/healthz")).status_code == 200
    r = await client.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready"}
