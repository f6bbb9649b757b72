"""Validation and compilation of GovernancePolicy documents (no I/O)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.ceilings import MAX_POLICY_MILLI_USD
from gateway.policy import (
    GovernancePolicy,
    PolicyInvalid,
    compile_documents,
    fingerprint,
    validate_documents,
)


def doc(name: str = "platform", *rules: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
            "metadata": {"name": name}, "spec": {"rules": list(rules)}}


def rule(name: str = "r", **body: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": name, "subject": {"kind": "team", "team": "platform"},
                            "failurePolicy": "FailClosed"}
    base.update(body)
    return base


def problems_of(*docs: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(PolicyInvalid) as info:
        compile_documents(list(docs))
    return info.value.problems


def paths(problems: list[tuple[str, str]]) -> set[str]:
    return {p for p, _ in problems}


def test_valid_document_compiles_one_rule_per_rule_with_exact_micro_usd() -> None:
    """A valid document compiles to one CompiledRule per rule, milliUSD ×1000 exactly."""
    rules = compile_documents([doc(
        "platform",
        rule("rate", rate={"rpm": 60, "tpm": 1000}),
        rule("spend", budget={"limitMilliUSD": 1234, "window": "day",
                              "lease": {"grant": 10, "renewInterval": "1m30s"}}),
        rule("quota", tokenQuota={"day": 5, "month": 50}),
        rule("free", rate={"unlimited": True}))])
    assert [r.uid for r in rules] == ["platform/rate", "platform/spend", "platform/quota",
                                      "platform/free"]
    spend = rules[1]
    assert (spend.limit_micro_usd, spend.window, spend.hard_cap) == (1_234_000, "day", True)
    assert (spend.lease_grant_micro_usd, spend.lease_renew_ms) == (10_000, 90_000)
    assert (rules[2].tokens_per_day, rules[2].tokens_per_month) == (5, 50)
    assert rules[3].unlimited and rules[3].rpm is None


@given(st.integers(min_value=1, max_value=MAX_POLICY_MILLI_USD))
def test_milli_usd_conversion_is_exact(limit: int) -> None:
    """Any integer milliUSD limit becomes exactly limit*1000 µUSD (no float on the path)."""
    [compiled] = compile_documents([doc("p", rule(budget={"limitMilliUSD": limit,
                                                          "window": "month"}))])
    assert compiled.limit_micro_usd == limit * 1000


def test_fractional_milli_usd_is_refused_not_rounded() -> None:
    """limitMilliUSD: 1.5 is an error naming the field, never rounded to 2."""
    [(path, msg)] = problems_of(doc("p", rule(budget={"limitMilliUSD": 1.5,
                                                      "window": "day"})))
    assert path == "p:spec.rules[0].budget.limitMilliUSD"
    assert "integer" in msg


@pytest.mark.parametrize(("body", "field"), [
    ({"unlimited": True, "limitMilliUSD": 5}, "limitMilliUSD"),
    ({"unlimited": True, "hardCap": False}, "hardCap"),
    ({"unlimited": True, "adminContact": "ops@example.com"}, "adminContact"),
    ({"unlimited": True, "lease": {"grant": 1, "renewInterval": "10s"}}, "lease"),
])
def test_unlimited_budget_with_a_limit_field_is_rejected(body: dict[str, Any],
                                                         field: str) -> None:
    """An unlimited budget that also sets a limit field is a contradiction (ADR-039)."""
    assert paths(problems_of(doc("p", rule(budget=body)))) == {
        f"p:spec.rules[0].budget.{field}"}


@pytest.mark.parametrize("field", ["rpm", "tpm"])
def test_unlimited_rate_with_rpm_or_tpm_is_rejected(field: str) -> None:
    """An unlimited rate rule that also sets rpm/tpm is rejected at that field."""
    assert paths(problems_of(doc("p", rule(rate={"unlimited": True, field: 5})))) == {
        f"p:spec.rules[0].rate.{field}"}


def test_rate_rule_must_limit_rpm_or_tpm() -> None:
    """A rate rule that limits nothing (and is not unlimited) is refused."""
    [(path, msg)] = problems_of(doc("p", rule(rate={})))
    assert path == "p:spec.rules[0].rate" and "rpm" in msg


def test_token_quota_requires_fail_closed() -> None:
    """tokenQuota with FailOpen is refused at failurePolicy."""
    [(path, msg)] = problems_of(doc("p", rule(failurePolicy="FailOpen",
                                              tokenQuota={"day": 10})))
    assert path == "p:spec.rules[0].failurePolicy" and "FailClosed" in msg


def test_failure_policy_is_required_with_no_default() -> None:
    """A rule without failurePolicy is refused; there is no default (ADR-031)."""
    body = rule(rate={"rpm": 1})
    del body["failurePolicy"]
    assert problems_of(doc("p", body)) == [("p:spec.rules[0].failurePolicy", "required")]


def test_every_problem_is_reported_with_its_path() -> None:
    """One pass reports all problems of all documents, each prefixed by its document."""
    bad_a = doc("a", rule("x", rate={"rpm": 0}),
                rule("y", budget={"limitMilliUSD": -1, "window": "week"}),
                rule("z", burst={"max": 3}, rate={"rpm": 1}))
    bad_b = doc("b", rule("x", failurePolicy="FailSoft", rate={"rpm": 1}),
                rule("y", subject={"kind": "user"}, rate={"rpm": 1}))
    found = paths(problems_of(bad_a, bad_b))
    assert found == {
        "a:spec.rules[0].rate.rpm", "a:spec.rules[1].budget.limitMilliUSD",
        "a:spec.rules[1].budget.window", "a:spec.rules[2].burst",
        "b:spec.rules[0].failurePolicy", "b:spec.rules[1].subject.user"}


def test_unknown_rule_type_is_refused_with_the_reason() -> None:
    """A rule type this build cannot enforce is an error, never silently ignored."""
    [(path, msg)] = problems_of(doc("p", rule(rate={"rpm": 1}, guardrail={"pii": True})))
    assert path == "p:spec.rules[0].guardrail"
    assert "can enforce" in msg and msg.startswith("not a rule type")


def test_unsupported_api_version_is_refused() -> None:
    """A document of another API version is refused at apiVersion."""
    d = doc("p", rule(rate={"rpm": 1}))
    d["apiVersion"] = "inferplane.dev/v2"
    assert paths(problems_of(d)) == {"p:apiVersion"}


def test_duplicate_uids_across_documents_are_rejected() -> None:
    """Two rules with one uid (explicit or derived) in a set are refused."""
    found = problems_of(doc("a", rule("x", uid="shared", rate={"rpm": 1})),
                        doc("b", rule("y", uid="shared", rate={"rpm": 2})))
    assert found == [("b:spec.rules[0].uid",
                      "duplicate rule uid 'shared' (also a:spec.rules[0])")]


def test_duplicate_policy_names_are_rejected() -> None:
    """Two documents with one metadata.name in a set are refused."""
    found = paths(problems_of(doc("a", rule("x", rate={"rpm": 1})),
                              doc("a", rule("y", rate={"rpm": 1}))))
    assert "a:metadata.name" in found


def test_exactly_one_rule_type() -> None:
    """A rule with two types, or none, is refused at the rule's path."""
    found = paths(problems_of(doc("p", rule("x", rate={"rpm": 1},
                                            tokenQuota={"day": 1}), rule("y"))))
    assert found == {"p:spec.rules[0]", "p:spec.rules[1]"}


def test_subject_fields_match_kind() -> None:
    """kind team forbids user; kind team-user needs both names."""
    found = paths(problems_of(doc(
        "p", rule("x", subject={"kind": "team", "team": "t", "user": "u"}, rate={"rpm": 1}),
        rule("y", subject={"kind": "team-user", "team": "*"}, rate={"rpm": 1}))))
    assert found == {"p:spec.rules[0].subject.user", "p:spec.rules[1].subject.user"}


def test_uid_default_is_policy_slash_rule_and_stable_under_reordering() -> None:
    """Without an explicit uid the uid is '<policy>/<rule>', whatever the order."""
    one = compile_documents([doc("b", rule("x", rate={"rpm": 1})),
                             doc("a", rule("y", rate={"rpm": 1}))])
    two = compile_documents([doc("a", rule("y", rate={"rpm": 1})),
                             doc("b", rule("x", rate={"rpm": 1}))])
    assert one == two
    assert [r.uid for r in one] == ["a/y", "b/x"]


def test_typed_documents_are_validated_like_mappings() -> None:
    """A GovernancePolicy Struct built in code is checked too (constraints not bypassed)."""
    import msgspec
    good = msgspec.convert(doc("p", rule(rate={"rpm": 1})), GovernancePolicy)
    bad = msgspec.structs.replace(good, spec=msgspec.structs.replace(
        good.spec, rules=[msgspec.structs.replace(good.spec.rules[0], name="Bad Name")]))
    assert len(compile_documents([good])) == 1
    assert paths(problems_of(bad)) == {"p:spec.rules[0].name"}  # type: ignore[arg-type]


def test_lease_renew_interval_and_grant_bounds() -> None:
    """A lease renews at least every 1s and grants no more than the limit."""
    found = paths(problems_of(doc("p", rule(budget={
        "limitMilliUSD": 10, "window": "day",
        "lease": {"grant": 11, "renewInterval": "500ms"}}))))
    assert found == {"p:spec.rules[0].budget.lease.renewInterval",
                     "p:spec.rules[0].budget.lease.grant"}


def test_fingerprint_ignores_order_and_sees_content() -> None:
    """Equal document sets fingerprint equal in any order; any edit changes it."""
    a, b = doc("a", rule(rate={"rpm": 1})), doc("b", rule(rate={"rpm": 2}))
    edited = copy.deepcopy(b)
    edited["spec"]["rules"][0]["rate"]["rpm"] = 3
    assert fingerprint([a, b]) == fingerprint([b, a])
    assert fingerprint([a, b]) != fingerprint([a, edited])


def test_validate_documents_keeps_valid_ones_separate() -> None:
    """validate_documents returns the valid documents and the problems of the others."""
    policies, problems = validate_documents([doc("ok", rule(rate={"rpm": 1})),
                                             doc("bad", rule(rate={}))])
    assert [p.metadata.name for p in policies] == ["ok"]
    assert paths(problems) == {"bad:spec.rules[0].rate"}
