"""RoutingPolicy and GuardrailPolicy documents: validation (every problem, with its path),
compilation, the lease plane's per-document application, and the overlay a gateway
applies (gateway/policy/_kinds.py, _overlay.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gateway.config import Deployment, ModelSettings
from gateway.config._routing import RoutingSettings
from gateway.guardrails import GuardrailSettings, policy_for
from gateway.lease._apply import GATE_PREFIX, apply_documents
from gateway.policy import (
    PolicyInvalid,
    PolicySnapshot,
    compile_all,
    compile_documents,
    routed_model,
    tenant_guardrails,
    validate_document,
)

V = "inferplane.dev/v1alpha1"


def routing(name: str, *models: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": V, "kind": "RoutingPolicy", "metadata": {"name": name},
            "spec": {"models": list(models)}}


def guardrails(name: str, subject: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": V, "kind": "GuardrailPolicy", "metadata": {"name": name},
            "spec": {"subject": subject, **spec}}


def team(name: str) -> dict[str, str]:
    return {"kind": "team", "team": name}


def problems_of(*docs: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(PolicyInvalid) as exc:
        compile_all(list(docs))
    return exc.value.problems


def test_a_valid_routing_document_compiles_to_per_model_overrides() -> None:
    doc = routing("sonnet", {"model": "sonnet", "strategy": "ordered", "deployments": [
        {"name": "east", "weight": 0}, {"name": "west", "weight": 5, "maxInflight": 7}]})
    rules, routes, guards = compile_all([doc])
    assert (rules, guards) == ((), ())
    [r] = routes
    assert (r.policy, r.model, r.strategy) == ("sonnet", "sonnet", "ordered")
    assert r.weights == {"east": 0, "west": 5} and r.max_inflight == {"west": 7}


def test_routing_problems_are_all_reported_with_their_paths() -> None:
    doc = routing("bad", {"model": "m", "deployments": [
        {"name": "a", "weight": -1}, {"name": "a", "weight": 1}, {"name": "b"}]},
        {"model": "m", "strategy": "fastest"}, {"model": "n"},
        {"model": "o", "deployments": [{"name": "x", "weight": 1.5, "colour": "red"}]})
    got = problems_of(doc)
    paths = [p for p, _ in got]
    assert "bad:spec.models[0].deployments[0].weight" in paths  # -1 < 0
    assert "bad:spec.models[0].deployments[1].name" in paths  # duplicate deployment
    assert "bad:spec.models[0].deployments[2]" in paths  # sets nothing
    assert "bad:spec.models[1].model" in paths  # model routed twice
    assert "bad:spec.models[1].strategy" in paths  # not a strategy
    assert "bad:spec.models[2]" in paths  # routes nothing
    assert "bad:spec.models[3].deployments[0].weight" in paths  # a fraction, never rounded
    assert "bad:spec.models[3].deployments[0].colour" in paths  # unknown field
    assert len(got) == 8, got


def test_two_documents_may_not_route_one_model() -> None:
    got = problems_of(routing("a", {"model": "m", "strategy": "ordered"}),
                      routing("b", {"model": "m", "strategy": "weighted"}))
    assert got == [("b:spec.models[0].model",
                    "model 'm' is already routed by the document 'a'")]


def test_a_valid_guardrail_document_compiles() -> None:
    doc = guardrails("pay", team("payments"), actions={"card": "block"},
                     rules=[{"name": "customer_id", "pattern": "CUST-[0-9]{8}"}])
    _, _, [g] = compile_all([doc])
    assert (g.policy, g.team, g.actions) == ("pay", "payments", {"card": "block"})
    assert [(r.name, r.action, r.kind) for r in g.rules] == [("customer_id", "mask", "pii")]
    _, _, [org] = compile_all([guardrails("all", {"kind": "org"})])
    assert org.team is None


@pytest.mark.parametrize(("pattern", "why"), [
    ("(a+)+$", None),  # catastrophic backtracking elsewhere: RE2 runs it linearly, accepted
    ("(a)\\1", "not a linear-time (RE2) pattern"),  # a backreference
    ("(?=x)y", "not a linear-time (RE2) pattern"),  # a lookahead
    ("a{1000}{1000}", "not a linear-time (RE2) pattern"),  # bad repetition
    ("(abc){900}", "pattern too large"),
    ("x*", "must not match the empty string"),
])
def test_tenant_patterns_are_vetted_at_publish(pattern: str, why: str | None) -> None:
    doc = guardrails("t", team("a"), rules=[{"name": "r", "pattern": pattern}])
    if why is None:
        compile_all([doc])
        return
    [(path, message)] = problems_of(doc)
    assert path == "t:spec.rules[0].pattern" and why in message, message


def test_the_accepted_hostile_pattern_runs_in_linear_time() -> None:
    """``(a+)+$`` against ``a…ab`` takes exponential time in a backtracking engine; on
    RE2 50,000 characters take well under a second (measured ~1 ms)."""
    from gateway.guardrails import vet

    compiled = vet("(a+)+$")
    text = "a" * 50_000 + "b"
    start = time.perf_counter()
    assert compiled.search(text) is None
    assert time.perf_counter() - start < 1.0


def test_guardrail_problems_are_all_reported() -> None:
    doc = guardrails("g", {"kind": "team"}, actions={"card": "shred", "nope": "mask"},
                     rules=[{"name": "Bad Name", "pattern": ""},
                            {"name": "card", "pattern": "x"},
                            {"name": "dup", "pattern": "y"}, {"name": "dup", "pattern": "z"}])
    paths = sorted(p for p, _ in problems_of(doc))
    assert paths == sorted([
        "g:spec.subject.team", "g:spec.actions.card", "g:spec.actions.nope",
        "g:spec.rules[0].name", "g:spec.rules[0].pattern", "g:spec.rules[1].name",
        "g:spec.rules[3].name"])


def test_one_guardrail_document_per_subject_and_subject_shapes() -> None:
    got = problems_of(guardrails("a", team("x")), guardrails("b", team("x")),
                      guardrails("c", {"kind": "org"}), guardrails("d", {"kind": "org"}))
    assert [p for p, _ in got] == ["b:spec.subject", "d:spec.subject"]
    assert [p for p, _ in problems_of(guardrails("e", {"kind": "org", "team": "x"}))] == [
        "e:spec.subject.team"]
    assert [p for p, _ in problems_of(guardrails("f", team("*")))] == ["f:spec.subject.team"]


def test_an_unknown_kind_names_the_known_ones() -> None:
    _, problems = validate_document({"apiVersion": V, "kind": "QuotaPolicy",
                                     "metadata": {"name": "q"}, "spec": {"rules": []}})
    assert ("kind", "must be one of GovernancePolicy, RoutingPolicy, GuardrailPolicy; got "
                    "'QuotaPolicy'") in problems


def test_governance_compilation_ignores_the_other_kinds_but_validates_them() -> None:
    gov = {"apiVersion": V, "kind": "GovernancePolicy", "metadata": {"name": "p"},
           "spec": {"rules": [{"name": "r", "subject": team("a"), "failurePolicy": "FailOpen",
                               "rate": {"rpm": 5}}]}}
    [rule] = compile_documents([gov, guardrails("g", team("a"))])
    assert rule.uid == "p/r"
    with pytest.raises(PolicyInvalid):
        compile_documents([gov, guardrails("g", team("a"), actions={"x": "mask"})])
    # Names are unique across kinds: a generation's documents are keyed by name.
    assert [p for p, _ in problems_of(gov, {**guardrails("p", team("a"))})] == [
        "p:metadata.name"]


# -- what a gateway applies ---------------------------------------------------------------


def model(routing_: RoutingSettings | None = None) -> ModelSettings:
    return ModelSettings(name="m", routing=routing_, deployments=[
        Deployment(provider="east", name="east"), Deployment(provider="west", name="west")])


def snapshot(*docs: dict[str, Any], generation: int = 1) -> PolicySnapshot:
    rules, routes, guards = compile_all(list(docs))
    return PolicySnapshot(generation=generation, rules=rules, routing=routes,
                          guardrails=guards)


def test_routed_model_overlays_the_named_fields_only() -> None:
    base = model(RoutingSettings(strategy="least_busy", cooldown_s=7.0))
    snap = snapshot(routing("r", {"model": "m", "deployments": [
        {"name": "east", "weight": 0}, {"name": "west", "maxInflight": 3}]}))
    out = routed_model(base, snap)
    assert [(d.weight, d.max_inflight) for d in out.deployments] == [(0, None), (1, 3)]
    assert out.routing == base.routing  # strategy and cooldown kept: the document names none
    assert routed_model(base, snap) is out  # computed once per generation
    assert routed_model(base, PolicySnapshot()) is base
    plain = routed_model(model(), snapshot(routing("r", {"model": "m", "strategy": "ordered"})))
    assert plain.routing == RoutingSettings(strategy="ordered")


def test_a_routing_document_naming_what_the_gateway_lacks_is_not_applied() -> None:
    base = model()
    snap = snapshot(routing("r", {"model": "m", "deployments": [{"name": "north",
                                                                  "weight": 1}]}))
    assert routed_model(base, snap) is base


def test_tenant_guardrails_layer_the_documents_over_the_file() -> None:
    file = GuardrailSettings(actions={"email": "monitor"})
    snap = snapshot(guardrails("pay", team("payments"), actions={"card": "block"},
                               rules=[{"name": "cust", "pattern": "CUST-[0-9]{8}"}]))
    settings, profiles = tenant_guardrails(file, snap, "payments", ("strict",))
    assert profiles == ("strict", "policy:pay")
    policy = policy_for(settings, profiles)
    assert policy is not None and policy.actions["card"] == "block"
    assert policy.actions["cust"] == "mask" and policy.detectors[-1].name == "cust"
    # Another team: not guarded (the file's block is off and it names no profile).
    other, none = tenant_guardrails(file, snap, "web", ())
    assert none == () and policy_for(other, none) is None
    # An org document guards every team, its actions over the file's.
    org = snapshot(guardrails("all", {"kind": "org"}, actions={"email": "block"}))
    s2, p2 = tenant_guardrails(file, org, "web", ())
    policy2 = policy_for(s2, p2)
    assert policy2 is not None and policy2.actions["email"] == "block"


def test_a_lease_plane_applies_the_kinds_per_document() -> None:
    docs = {"r": routing("r", {"model": "m", "deployments": [{"name": "west",
                                                                "weight": 0}]}),
            "g": guardrails("g", team("a")),
            "lost": routing("lost", {"model": "m2", "strategy": "ordered"})}
    applied = apply_documents(docs, namespace="n", generation=3, fingerprint="f",
                              deployments={"m": ["east", "west"]})
    assert [r.model for r in applied.snapshot.routing] == ["m"]
    assert [g.team for g in applied.snapshot.guardrails] == ["a"]
    [rejection] = applied.rejections
    assert rejection.name == "lost"
    assert "not configured on this gateway" in rejection.problems[0].message
    assert applied.snapshot.rules == ()  # a rejected routing document gates nothing


def test_a_lease_plane_gates_the_team_of_a_guardrail_document_it_cannot_apply() -> None:
    bad = guardrails("g", team("a"), actions={"detector_from_the_future": "block"})
    applied = apply_documents({"g": bad}, namespace="n", generation=1, fingerprint="f")
    [rejection] = applied.rejections
    assert rejection.problems[0].path == "spec.actions.detector_from_the_future"
    [gate] = applied.snapshot.rules
    assert gate.uid == f"{GATE_PREFIX}g/guardrails" and gate.team == "a"
    assert gate.applies_to("a", None) and not gate.applies_to("b", None)


def test_local_policy_files_carry_the_kinds_and_reload(tmp_path: Any) -> None:
    """The local profile's ``policies:`` files take the new kinds too (all or nothing)."""
    import yaml

    from gateway.policy import FilePolicySource

    path = tmp_path / "routing.yaml"
    path.write_text(yaml.safe_dump_all([
        routing("r", {"model": "m", "strategy": "ordered"}),
        guardrails("g", team("a"), actions={"card": "block"})]))
    source = FilePolicySource([str(path)], poll_s=0)
    source.reload(strict=True)
    snap = source.snapshot()
    assert [r.strategy for r in snap.routing] == ["ordered"]
    assert [g.team for g in snap.guardrails] == ["a"]
    path.write_text(yaml.safe_dump(guardrails("g", team("a"), rules=[
        {"name": "bad", "pattern": "(a)\\1"}])))
    assert source.reload() is False  # refused: the previous generation stays
    assert source.snapshot() is snap


def test_the_router_names_an_overlaid_models_deployments_by_position() -> None:
    """Two deployments that differ only by weight are equal once a document gives them
    the same weight: the router still tells them apart (by object, then position)."""
    from gateway.routing import Router

    base = ModelSettings(name="m", deployments=[Deployment(provider="p", weight=1),
                                                Deployment(provider="p", weight=2)])
    router = Router()
    assert [router.name_of(base, d) for d in base.deployments] == ["p/m", "p/m#2"]
    out = routed_model(base, snapshot(routing("r", {"model": "m", "deployments": [
        {"name": "p/m", "weight": 5}, {"name": "p/m#2", "weight": 5}]})))
    assert out.deployments[0] == out.deployments[1]
    assert [router.name_of(out, d) for d in out.deployments] == ["p/m", "p/m#2"]
