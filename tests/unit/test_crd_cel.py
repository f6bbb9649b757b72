"""The GovernancePolicy CRD rejects exactly what the Python validator rejects.

A small stand-in for the API server's checks: the openAPIV3Schema (types, required,
enums, bounds, patterns, unknown fields as with strict field validation, list-map keys)
and every ``x-kubernetes-validations`` CEL rule, evaluated with cel-python. Each document
below is fed to both the CRD and ``compile_documents``; both must agree. Cases marked
``cel`` must be refused by a CEL rule specifically, so a CEL rule removed from the CRD
makes this test fail.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from gateway.policy import PolicyInvalid, compile_documents

CRD_PATH = Path(__file__).resolve().parents[2] / "helm/inferplane/crds/governancepolicy.yaml"
CRD = yaml.safe_load(CRD_PATH.read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
CEL = celpy.Environment()
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def _schema_errors(value: Any, schema: dict[str, Any], path: str) -> list[tuple[str, str]]:
    kind = schema.get("type")
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            return [(path, "schema: must be an integer")]
    elif kind in _TYPES and not isinstance(value, _TYPES[kind]):
        return [(path, f"schema: must be {kind}")]
    out: list[tuple[str, str]] = []
    if "enum" in schema and value not in schema["enum"]:
        out.append((path, "schema: enum"))
    if "minimum" in schema and value < schema["minimum"]:
        out.append((path, "schema: minimum"))
    if "maximum" in schema and value > schema["maximum"]:
        out.append((path, "schema: maximum"))
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength",
                                                                               10**9):
            out.append((path, "schema: length"))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append((path, "schema: pattern"))
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        out += [(f"{path}.{k}", "schema: unknown field") for k in value if k not in props]
        out += [(f"{path}.{k}", "schema: required") for k in schema.get("required", [])
                if k not in value]
        for k, sub in props.items():
            if k in value:
                out += _schema_errors(value[k], sub, f"{path}.{k}")
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", 10**9):
            out.append((path, "schema: maxItems"))
        keys = schema.get("x-kubernetes-list-map-keys")
        if keys:
            seen = [tuple(v.get(k) for k in keys) for v in value if isinstance(v, dict)]
            if len(seen) != len(set(seen)):
                out.append((path, "schema: duplicate list-map key"))
        for i, item in enumerate(value):
            out += _schema_errors(item, schema["items"], f"{path}[{i}]")
    return out


def _cel_errors(value: Any, schema: dict[str, Any], path: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for rule in schema.get("x-kubernetes-validations", []):
        program = CEL.program(CEL.compile(rule["rule"]))
        result = program.evaluate({"self": celpy.json_to_cel(value)})
        if not isinstance(result, celpy.celtypes.BoolType) or not result:
            out.append((path + rule.get("fieldPath", ""), f"cel: {rule['message']}"))
    if isinstance(value, dict):
        for k, sub in schema.get("properties", {}).items():
            if k in value:
                out += _cel_errors(value[k], sub, f"{path}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += _cel_errors(item, schema["items"], f"{path}[{i}]")
    return out


def crd_errors(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """What the API server would refuse: schema first; CEL only on a schema-valid object."""
    errors = _schema_errors(doc, SCHEMA, "")
    return errors or _cel_errors(doc, SCHEMA, "")


def python_problems(doc: dict[str, Any]) -> list[tuple[str, str]]:
    try:
        compile_documents([doc])
    except PolicyInvalid as exc:
        return exc.problems
    return []


def policy(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
            "metadata": {"name": "p"}, "spec": {"rules": list(rules)}}


def rule(name: str = "r", *, fp: str | None = "FailClosed", **body: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "subject": {"kind": "team", "team": "platform"}}
    if fp is not None:
        out["failurePolicy"] = fp
    out.update(body)
    return out


LEASE = {"grant": 10, "renewInterval": "10s"}

VALID = {
    "budget-fit": policy(rule(budget={"limitMilliUSD": 1000, "window": "day",
                                      "onShortfall": "fit", "fitFloorTokens": 2048})),
    "full": policy(
        rule("rate", fp="FailOpen", rate={"rpm": 60, "tpm": 1000}),
        rule("spend", budget={"limitMilliUSD": 500, "window": "month", "hardCap": True,
                              "lease": LEASE, "adminContact": "ops@example.com"}),
        rule("quota", tokenQuota={"day": 100}, subject={"kind": "team-user", "team": "*",
                                                         "user": "*"}),
        rule("free-rate", fp="FailOpen", rate={"unlimited": True}, uid="free-1"),
        rule("free-spend", budget={"unlimited": True, "window": "day"},
             subject={"kind": "user", "user": "alice"})),
    "minimal": policy(rule(rate={"tpm": 1})),
    "concurrency": policy(
        rule("key-slots", concurrency={"maxInFlight": 4}, subject={"kind": "key",
                                                                   "key": "key_1"}),
        rule("team-slots", fp="FailOpen", concurrency={"maxInFlight": 50}),
        rule("user-slots", concurrency={"maxInFlight": 2},
             subject={"kind": "team-user", "team": "*", "user": "*"})),
    "no-rules": policy(),
}

# (document, "cel" | "schema"): which layer of the CRD must refuse it.
INVALID = {
    "fit-floor-without-fit": (policy(rule(budget={"limitMilliUSD": 5, "window": "day",
                                                  "fitFloorTokens": 10})), "cel"),
    "unlimited-with-fit": (policy(rule(budget={"unlimited": True, "onShortfall": "fit"})),
                           "cel"),
    "on-shortfall-unknown": (policy(rule(budget={"limitMilliUSD": 5, "window": "day",
                                                 "onShortfall": "borrow"})), "schema"),
    "rate-unlimited-rpm": (policy(rule(rate={"unlimited": True, "rpm": 5})), "cel"),
    "rate-unlimited-tpm": (policy(rule(rate={"unlimited": True, "tpm": 5})), "cel"),
    "rate-limits-nothing": (policy(rule(rate={})), "cel"),
    "rate-unlimited-false-nothing": (policy(rule(rate={"unlimited": False})), "cel"),
    "budget-unlimited-limit": (policy(rule(budget={"unlimited": True,
                                                   "limitMilliUSD": 5})), "cel"),
    "budget-unlimited-hardcap": (policy(rule(budget={"unlimited": True,
                                                     "hardCap": False})), "cel"),
    "budget-unlimited-lease": (policy(rule(budget={"unlimited": True, "lease": LEASE})),
                               "cel"),
    "budget-unlimited-contact": (policy(rule(budget={"unlimited": True,
                                                     "adminContact": "x"})), "cel"),
    "budget-no-window": (policy(rule(budget={"limitMilliUSD": 5})), "cel"),
    "budget-no-limit": (policy(rule(budget={"window": "day"})), "cel"),
    "lease-grant-over-limit": (policy(rule(budget={"limitMilliUSD": 5, "window": "day",
                                                   "lease": LEASE})), "cel"),
    "lease-renew-too-fast": (policy(rule(budget={
        "limitMilliUSD": 50, "window": "day",
        "lease": {"grant": 1, "renewInterval": "500ms"}})), "cel"),
    "quota-fail-open": (policy(rule(fp="FailOpen", tokenQuota={"day": 5})), "cel"),
    "quota-empty": (policy(rule(tokenQuota={})), "cel"),
    "two-types": (policy(rule(rate={"rpm": 1}, tokenQuota={"day": 1})), "cel"),
    "no-type": (policy(rule()), "cel"),
    "team-subject-without-team": (policy(rule(rate={"rpm": 1}, subject={"kind": "team"})),
                                  "cel"),
    "team-subject-with-user": (policy(rule(rate={"rpm": 1}, subject={
        "kind": "team", "team": "t", "user": "u"})), "cel"),
    "team-user-without-user": (policy(rule(rate={"rpm": 1}, subject={
        "kind": "team-user", "team": "t"})), "cel"),
    "user-subject-with-team": (policy(rule(rate={"rpm": 1}, subject={
        "kind": "user", "user": "u", "team": "t"})), "cel"),
    "duplicate-uids": (policy(rule("a", rate={"rpm": 1}, uid="x"),
                              rule("b", rate={"rpm": 1}, uid="x")), "cel"),
    "failure-policy-missing": (policy(rule(fp=None, rate={"rpm": 1})), "schema"),
    "failure-policy-unknown": (policy(rule(fp="FailSoft", rate={"rpm": 1})), "schema"),
    "window-week": (policy(rule(budget={"limitMilliUSD": 5, "window": "week"})), "schema"),
    "limit-zero": (policy(rule(budget={"limitMilliUSD": 0, "window": "day"})), "schema"),
    "limit-fractional": (policy(rule(budget={"limitMilliUSD": 1.5, "window": "day"})),
                         "schema"),
    "rpm-negative": (policy(rule(rate={"rpm": -1})), "schema"),
    "rpm-overflow": (policy(rule(rate={"rpm": 10**12})), "schema"),
    "unknown-rule-type": (policy(rule(rate={"rpm": 1}, burst={"max": 2})), "schema"),
    "unknown-rate-field": (policy(rule(rate={"rpm": 1, "rps": 2})), "schema"),
    "duplicate-rule-names": (policy(rule("a", rate={"rpm": 1}), rule("a", rate={"rpm": 2})),
                             "schema"),
    "bad-duration": (policy(rule(budget={"limitMilliUSD": 50, "window": "day",
                                         "lease": {"grant": 1,
                                                   "renewInterval": "10 seconds"}})),
                     "schema"),
    "key-subject-with-rate": (policy(rule(rate={"rpm": 1}, subject={
        "kind": "key", "key": "key_1"})), "cel"),
    "key-subject-without-key": (policy(rule(concurrency={"maxInFlight": 1}, subject={
        "kind": "key"})), "cel"),
    "team-subject-with-key": (policy(rule(concurrency={"maxInFlight": 1}, subject={
        "kind": "team", "team": "t", "key": "key_1"})), "cel"),
    "key-subject-with-team": (policy(rule(concurrency={"maxInFlight": 1}, subject={
        "kind": "key", "key": "key_1", "team": "t"})), "cel"),
    "concurrency-zero": (policy(rule(concurrency={"maxInFlight": 0})), "schema"),
    "concurrency-empty": (policy(rule(concurrency={})), "schema"),
    "bad-subject-kind": (policy(rule(rate={"rpm": 1}, subject={"kind": "group",
                                                               "team": "t"})), "schema"),
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_documents_pass_both(name: str) -> None:
    """A valid document is accepted by the CRD (schema + CEL) and the Python validator."""
    assert crd_errors(VALID[name]) == []
    assert python_problems(VALID[name]) == []


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_documents_are_rejected_by_both(name: str) -> None:
    """An invalid document is refused by the CRD, by the expected layer, and by Python."""
    doc, layer = INVALID[name]
    errors = crd_errors(copy.deepcopy(doc))
    assert errors, f"CRD accepted {name}"
    assert all(msg.startswith(f"{layer}:") for _, msg in errors), errors
    assert python_problems(doc), f"Python validator accepted {name}"


def test_every_cel_rule_rejects_some_case() -> None:
    """Each CEL rule in the CRD is exercised: removing none of them goes unnoticed."""
    messages = {msg for doc, _ in INVALID.values() for _, msg in crd_errors(doc)}
    rules: list[str] = []

    def walk(schema: dict[str, Any]) -> None:
        rules.extend(f"cel: {r['message']}" for r in schema.get("x-kubernetes-validations", []))
        for sub in schema.get("properties", {}).values():
            walk(sub)
        if "items" in schema:
            walk(schema["items"])

    walk(SCHEMA)
    assert rules and set(rules) <= messages


def test_failure_policy_has_no_default_in_the_crd() -> None:
    """failurePolicy is required in the CRD and carries no schema default (ADR-031)."""
    item = SCHEMA["properties"]["spec"]["properties"]["rules"]["items"]
    assert "failurePolicy" in item["required"]
    assert "default" not in item["properties"]["failurePolicy"]
