"""GuardrailPolicy and RoutingPolicy documents published by inferplaned, applied by a real
shared-profile ``mayu serve`` without a restart (issues 37 and 39).

One Postgres database, ``inferplaned``, one gateway, and two scripted upstreams standing
for two deployments of one model (``east``: weight 1, ``west``: weight 0 in the config
file), whose ledgers of bodies are each upstream's own record of what left the gateway.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e._controlplane import MODEL, PRICE, SharedStack
from tests.e2e._procs import Proc, _env, free_port, wait_ready

pytestmark = pytest.mark.e2e

V = "inferplane.dev/v1alpha1"
AWS_KEY = "AKIAQ3EGRTWQZ7MX5KDP"
"""A planted AWS access key id (the ``aws_key`` detector's format)."""
CUSTOMER = "CUST-40417733"
"""A planted customer id, found only by team A's tenant rule."""
RELOAD_S = 15.0
"""How long a published generation may take to reach the gateway here. NOTIFY delivers it
at once and the poll (``database.policy_refresh_s``, 1 s) catches a missed one (measured
0.2-1.3 s); the bound is generous because every probe is a real request on a loaded
2-core machine, and the measured figure is printed."""


def _scripted_upstream(workdir: Path, name: str) -> Proc:
    port = free_port()
    log_path = workdir / f"upstream-{name}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen([sys.executable, "-m", "gateway.mock._script",
                                  "--port", str(port)], stdout=log,
                                 stderr=subprocess.STDOUT, env=_env(), cwd=workdir)
    return wait_ready(Proc(popen, port, log_path))


@dataclass
class Kinds:
    stack: SharedStack
    upstreams: dict[str, Proc]
    keys: dict[str, str]

    def chat(self, team: str, text: str) -> httpx.Response:
        gateway = self.stack.gateways[0]
        return httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60,
                          headers={"authorization": f"Bearer {self.keys[team]}"},
                          json={"model": MODEL, "max_tokens": 20,
                                "messages": [{"role": "user", "content": text}]})

    def bodies(self, name: str) -> list[str]:
        out: list[str] = httpx.get(f"{self.upstreams[name].url}/__mock/bodies").json()
        return out

    def all_bodies(self) -> list[str]:
        return [b for name in self.upstreams for b in self.bodies(name)]

    def clear(self) -> None:
        for proc in self.upstreams.values():
            httpx.delete(f"{proc.url}/__mock/bodies").raise_for_status()

    def publish(self, name: str, doc: dict[str, Any]) -> float:
        """PUT the document; the monotonic time inferplaned answered 200."""
        r = self.stack.publish(name, doc)
        assert r.status_code == 200, r.text
        return time.monotonic()


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory, pg_module_dsn: str) -> Iterator[Kinds]:
    workdir = tmp_path_factory.mktemp("kinds")
    upstreams: dict[str, Proc] = {}
    try:
        for name in ("east", "west"):
            upstreams[name] = _scripted_upstream(workdir, name)
        gateway = {
            "server": {"replica_id": "gw0", "max_output_tokens": 100_000},
            "providers": [{"name": n, "kind": "openai", "base_url": f"{p.url}/v1"}
                          for n, p in upstreams.items()],
            "models": [{"name": MODEL, "price": PRICE, "routing": {"strategy": "weighted"},
                        "deployments": [{"provider": "east", "name": "east", "weight": 1},
                                        {"provider": "west", "name": "west", "weight": 0}]}]}
        stack = SharedStack.start(workdir, pg_module_dsn, gateways=1, gateway=gateway)
        try:
            yield Kinds(stack, upstreams, {t: stack.team_key(t) for t in ("team-a", "team-b")})
        finally:
            stack.stop()
    finally:
        for proc in upstreams.values():
            proc.stop()


def guardrail_doc(name: str, team: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": V, "kind": "GuardrailPolicy", "metadata": {"name": name},
            "spec": {"subject": {"kind": "team", "team": team}, **spec}}


def _wait_applied(k: Kinds, since: float, *, team: str, text: str,
                  applied: Any) -> float:
    """Seconds from ``since`` until ``team``'s request with ``text`` shows the new
    generation (``applied(response, upstream bodies)``); fails after RELOAD_S."""
    while True:
        k.clear()
        r = k.chat(team, text)
        if applied(r, k.all_bodies()):
            return time.monotonic() - since
        assert time.monotonic() - since < RELOAD_S, (r.status_code, r.text)
        time.sleep(0.05)


def test_a_guardrail_document_guards_its_team_only_and_reloads(kinds: Kinds) -> None:
    k = kinds
    leak = f"deploy with {AWS_KEY} for {CUSTOMER}"
    # Before: nobody is guarded (the config has no guardrails block).
    k.clear()
    assert k.chat("team-a", leak).status_code == 200
    assert any(AWS_KEY in b and CUSTOMER in b for b in k.all_bodies())

    doc = guardrail_doc("team-a-guardrails", "team-a", actions={"aws_key": "block"},
                        rules=[{"name": "customer_id", "pattern": "CUST-[0-9]{8}",
                                "action": "mask"}])
    since = k.publish("team-a-guardrails", doc)
    marker = f"ticket {CUSTOMER}"  # harmless to send while waiting for the generation
    took = _wait_applied(k, since, team="team-a", text=marker,
                         applied=lambda r, bodies: r.status_code == 200 and all(
                             CUSTOMER not in b for b in bodies) and bodies)
    print(f"\nguardrail document applied {took * 1000:.0f} ms after the PUT answered")
    assert "[CUSTOMER_ID]" in k.bodies("east")[0]

    # Team A: the planted secret is refused before anything leaves (400, the detector named,
    # the value never echoed); team B's identical request is not guarded.
    k.clear()
    r = k.chat("team-a", leak)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "guardrail_blocked" and "aws_key" in r.text
    assert AWS_KEY not in r.text and CUSTOMER not in r.text
    assert k.all_bodies() == []
    r = k.chat("team-b", leak)
    assert r.status_code == 200, r.text
    assert [AWS_KEY in b and CUSTOMER in b for b in k.all_bodies()] == [True]

    # Change the document: the secret is now masked instead of blocked.
    changed = guardrail_doc("team-a-guardrails", "team-a", actions={"aws_key": "mask"},
                            rules=doc["spec"]["rules"])
    since = k.publish("team-a-guardrails", changed)
    took = _wait_applied(k, since, team="team-a", text=leak,
                         applied=lambda r, bodies: r.status_code == 200)
    print(f"changed guardrail document applied {took * 1000:.0f} ms after the PUT answered")
    [body] = k.all_bodies()
    assert "[AWS_KEY]" in body and "[CUSTOMER_ID]" in body
    assert AWS_KEY not in body and CUSTOMER not in body

    # Unpublish: team A is unguarded again.
    r = k.stack.unpublish("team-a-guardrails")
    assert r.status_code == 200, r.text
    since = time.monotonic()
    _wait_applied(k, since, team="team-a", text=marker,
                  applied=lambda r, bodies: any(CUSTOMER in b for b in bodies))
    gateway_log = k.stack.gateways[0].log_path.read_text()
    assert AWS_KEY not in gateway_log and CUSTOMER not in gateway_log


def test_a_hostile_tenant_regex_is_refused_at_publish_with_its_path(kinds: Kinds) -> None:
    for pattern, why in [("(a)\\1", "not a linear-time (RE2) pattern"),
                         ("(?=secret)\\w+", "not a linear-time (RE2) pattern"),
                         ("(abc){900}", "pattern too large")]:
        doc = guardrail_doc("hostile", "team-b",
                            rules=[{"name": "evil", "pattern": pattern, "action": "block"}])
        r = kinds.stack.publish("hostile", doc)
        assert r.status_code == 422, r.text
        problems = r.json()["error"]["problems"]
        assert [p["path"] for p in problems] == ["hostile:spec.rules[0].pattern"], problems
        assert why in problems[0]["message"], problems
    published = kinds.stack.control_get("/v1alpha1/policies")["items"]
    assert "hostile" not in {d["metadata"]["name"] for d in published}


def test_a_catastrophic_backtracking_pattern_runs_in_bounded_time(kinds: Kinds) -> None:
    """``(a+)+$`` is exponential on ``aaa…ab`` for a backtracking engine; RE2 accepts it
    and scans linearly. Measured: a 200,000-character prompt through the gateway."""
    k = kinds
    doc = guardrail_doc("team-b-hostile", "team-b",
                        rules=[{"name": "evil", "pattern": "(a+)+$", "action": "mask"}])
    since = k.publish("team-b-hostile", doc)
    text = "a" * 200_000 + "b"
    plain = time.monotonic()
    assert k.chat("team-a", text).status_code == 200
    plain = time.monotonic() - plain
    # Wait for team B's generation with a small probe, then time the big one.
    _wait_applied(k, since, team="team-b", text="aaa",
                  applied=lambda r, bodies: any("[EVIL]" in b for b in bodies))
    start = time.monotonic()
    r = k.chat("team-b", text)
    took = time.monotonic() - start
    assert r.status_code == 200, r.text
    print(f"\n200,001 characters against (a+)+$: {took * 1000:.0f} ms "
          f"(unguarded team: {plain * 1000:.0f} ms)")
    assert took < 10.0
    assert k.stack.unpublish("team-b-hostile").status_code == 200


def test_a_routing_document_moves_the_traffic(kinds: Kinds) -> None:
    k = kinds
    k.clear()
    for _ in range(6):
        assert k.chat("team-b", "hello").status_code == 200
    assert (len(k.bodies("east")), len(k.bodies("west"))) == (6, 0)  # the file's weights

    doc = {"apiVersion": V, "kind": "RoutingPolicy", "metadata": {"name": "move-west"},
           "spec": {"models": [{"model": MODEL, "deployments": [
               {"name": "east", "weight": 0}, {"name": "west", "weight": 1}]}]}}
    since = k.publish("move-west", doc)
    took = _wait_applied(k, since, team="team-b", text="hello",
                         applied=lambda r, bodies: r.status_code == 200
                         and len(k.bodies("west")) == 1)
    print(f"\nrouting document applied {took * 1000:.0f} ms after the PUT answered")
    k.clear()
    for _ in range(10):
        assert k.chat("team-b", "hello").status_code == 200
    assert (len(k.bodies("east")), len(k.bodies("west"))) == (0, 10)

    # A document naming a deployment the model does not have is published (inferplaned
    # cannot know each gateway's deployments) but not applied: the gateway logs it and
    # keeps the file's routing.
    bad = {**doc, "metadata": {"name": "move-west"}, "spec": {"models": [{
        "model": MODEL, "deployments": [{"name": "north", "weight": 1}]}]}}
    k.publish("move-west", bad)
    log_path = k.stack.gateways[0].log_path
    deadline = time.monotonic() + RELOAD_S
    while "has no deployment 'north'" not in log_path.read_text():  # logged as it routes
        assert time.monotonic() < deadline, log_path.read_text()[-2000:]
        assert k.chat("team-b", "hello").status_code == 200
        time.sleep(0.05)
    k.clear()
    for _ in range(4):
        assert k.chat("team-b", "hello").status_code == 200
    assert (len(k.bodies("east")), len(k.bodies("west"))) == (4, 0)

    # A routing document that does not validate is a 422 with every problem.
    r = k.stack.publish("broken", {**doc, "metadata": {"name": "broken"}, "spec": {
        "models": [{"model": MODEL, "strategy": "fastest",
                    "deployments": [{"name": "east", "weight": -1}]}]}})
    assert r.status_code == 422, r.text
    assert sorted(p["path"] for p in r.json()["error"]["problems"]) == [
        "broken:spec.models[0].deployments[0].weight", "broken:spec.models[0].strategy"]
    assert k.stack.unpublish("move-west").status_code == 200


# -- the lease profile: one plane ----------------------------------------------------------


def test_a_lease_plane_applies_or_rejects_each_document(
        tmp_path: Path, pg_dsn: str) -> None:
    """One lease-profile plane: a GuardrailPolicy arrives in the sync answer's documents
    and applies to its team only, without a restart; a RoutingPolicy it cannot apply is
    rejected per document and the plane keeps serving.

    About 40 s on the loaded 2-core machine, nearly all of it starting processes:
    inferplaned, the upstream, the plane and four ``mayu teams/keys create`` runs took
    30 s before the first document was published; the documents then apply within
    about 2 s."""
    from tests.e2e._lease import MODEL as LEASE_MODEL
    from tests.e2e._lease import running_stack, wait_until

    upstream = _scripted_upstream(tmp_path, "lease")
    try:
        with running_stack(tmp_path, pg_dsn) as stack:
            plane = stack.add_plane("plane-a", teams=["team-a", "team-b"], upstream=upstream)
            assert plane is not None

            def chat(team: str, text: str) -> httpx.Response:
                return httpx.post(
                    f"{plane.url}/v1/chat/completions", timeout=60,
                    headers={"authorization": f"Bearer {stack.keys[('plane-a', team)]}"},
                    json={"model": LEASE_MODEL, "max_tokens": 20,
                          "messages": [{"role": "user", "content": text}]})

            stack.publish(guardrail_doc("team-a-guardrails", "team-a",
                                        actions={"aws_key": "block"}))
            wait_until(lambda: stack.applied_generation("plane-a") == 1,
                       what="the plane reports the published generation")
            leak = f"deploy with {AWS_KEY}"
            r = chat("team-a", leak)
            assert r.status_code == 400 and "aws_key" in r.text and AWS_KEY not in r.text
            r = chat("team-b", leak)
            assert r.status_code == 200, r.text
            bodies = httpx.get(f"{upstream.url}/__mock/bodies").json()
            assert [AWS_KEY in b for b in bodies] == [True]  # team B's only
            assert stack.dataplanes()["plane-a"]["rejections"] == []

            # A RoutingPolicy naming a deployment this plane does not have: published (the
            # control plane cannot know the planes' deployments), rejected by the plane in
            # its next heartbeat, and the plane keeps serving with its file's routing.
            stack.publish({"apiVersion": V, "kind": "RoutingPolicy",
                           "metadata": {"name": "elsewhere"},
                           "spec": {"models": [{"model": LEASE_MODEL, "deployments": [
                               {"name": "north", "weight": 1}]}]}})
            wait_until(lambda: bool(stack.dataplanes()["plane-a"]["rejections"]),
                       what="the plane rejects the routing document")
            [rejection] = stack.dataplanes()["plane-a"]["rejections"]
            assert rejection["name"] == "elsewhere"
            assert "no deployment 'north'" in rejection["problems"][0]["message"]
            assert chat("team-b", "still there?").status_code == 200
            r = chat("team-a", leak)  # the guardrail document still applies
            assert r.status_code == 400 and "aws_key" in r.text
    finally:
        upstream.stop()
