"""In-flight limits in the planner, the policy validator and the settlement split (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.governance import (
    CounterKey,
    Outcome,
    OutcomeKind,
    StoredFigures,
    build_request,
    is_slot,
    plan_charges,
    settlement_for,
)
from gateway.ingress._me import limit_entry
from gateway.keys import KeyLimits, Principal, Team, TeamLimits
from gateway.policy import PolicyInvalid, PolicySnapshot, compile_documents, effective_limits
from gateway.pricing import ModelPrice, Usage

NOW = datetime(2026, 12, 4, 12, tzinfo=UTC)
PRICE = ModelPrice(input=1_000_000, output=5_000_000)


def _principal(key_id: str = "key_a", user: str | None = "ann") -> Principal:
    return Principal(key_id=key_id, key_revision=1, key_prefix="ip-x", user=user,
                     team=Team(id="team_1", name="platform", revision=1,
                               limits=TeamLimits(usd_micros_per_day=10_000)),
                     key_limits=KeyLimits(), allowed_models=None)


def _doc(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
            "metadata": {"name": "p"}, "spec": {"rules": list(rules)}}


def _rule(name: str, body: dict[str, Any], **subject: str) -> dict[str, Any]:
    return {"name": name, "subject": subject, "failurePolicy": "FailClosed", **body}


def _snapshot(*rules: dict[str, Any]) -> PolicySnapshot:
    return PolicySnapshot(rules=compile_documents([_doc(*rules)]))


SLOTS = {"concurrency": {"maxInFlight": 4}}


def test_a_concurrency_rule_plans_one_slot_per_scope() -> None:
    """Key, team and user rules each add one requests window of amount 1 and limit
    maxInFlight, with no calendar window, named by the rule and the caller's scope."""
    snap = _snapshot(_rule("k", SLOTS, kind="key", key="key_a"),
                     _rule("t", SLOTS, kind="team", team="*"),
                     _rule("u", SLOTS, kind="team-user", team="platform", user="ann"),
                     _rule("other", SLOTS, kind="key", key="key_b"))
    charges = plan_charges(_principal(), snap, token_bound=10, usd_bound=10, now=NOW)
    slots = [c for c in charges if is_slot(c)]
    assert [c.counter for c in slots] == ["rule:p/k:key=key_a:inflight",
                                          "rule:p/t:team=platform:inflight",
                                          "rule:p/u:team=platform,user=ann:inflight"]
    assert all((c.kind, c.dimension, c.amount, c.limit, c.window) ==
               ("window", "requests", 1, 4, None) for c in slots)
    assert list(charges) == sorted(charges, key=lambda c: c.counter)


def test_no_concurrency_rule_plans_no_slot() -> None:
    """A request no concurrency rule covers (another key's rule) charges no slot."""
    snap = _snapshot(_rule("other", SLOTS, kind="key", key="key_b"))
    charges = plan_charges(_principal(), snap, token_bound=10, usd_bound=10, now=NOW)
    assert not any(is_slot(c) for c in charges)


def test_the_slot_counter_key_parses_back() -> None:
    """``rule:<uid>:<scope>:inflight`` is a CounterKey like the others."""
    key = CounterKey.rule("p/k", "key=key_a").in_flight()
    assert key.text == "rule:p/k:key=key_a:inflight"
    assert CounterKey.parse(key.text) == key
    assert CounterKey.parse("rule:p/k::inflight") is None


@pytest.mark.parametrize("kind", list(OutcomeKind))
def test_every_settlement_commits_nothing_to_a_slot(kind: OutcomeKind) -> None:
    """Whatever the outcome, a slot commits 0 and keeps no liability: settling frees it
    (an invalid settlement has no parts; the stores free its slots while freezing)."""
    snap = _snapshot(_rule("k", SLOTS, kind="key", key="*"))
    req = build_request(_principal(), snap, request_id="r", model="m", token_bound=100,
                        usd_bound=1_000, now=NOW)
    usage = Usage(input=10, output=5, cache_write_unknown=(
        3 if kind is OutcomeKind.TOKENS_KNOWN else 0))
    s = settlement_for(req, Outcome(kind=kind, usage=None if kind in (
        OutcomeKind.INVALID, OutcomeKind.CANCELLED) else usage), PRICE)
    name = "rule:p/k:key=key_a:inflight"
    assert s.kind is kind
    assert s.commits.get(name, 0) == 0 and name not in s.liabilities
    if kind is not OutcomeKind.INVALID:
        assert name in s.commits


@pytest.mark.parametrize(("rule", "where"), [
    (_rule("r", {"rate": {"rpm": 1}}, kind="key", key="key_a"), "subject.kind"),
    (_rule("r", SLOTS, kind="key"), "subject.key"),
    (_rule("r", SLOTS, kind="team", team="t", key="key_a"), "subject.key"),
    (_rule("r", {"concurrency": {"maxInFlight": 0}}, kind="team", team="t"),
     "concurrency.maxInFlight"),
    (_rule("r", {"concurrency": {}}, kind="team", team="t"), "concurrency.maxInFlight"),
    (_rule("r", {**SLOTS, "rate": {"rpm": 1}}, kind="team", team="t"), "spec.rules[0]"),
])
def test_bad_concurrency_rules_are_refused_with_their_path(rule: dict[str, Any],
                                                           where: str) -> None:
    """A key subject takes only a concurrency rule; maxInFlight is a positive integer."""
    with pytest.raises(PolicyInvalid) as err:
        compile_documents([_doc(rule)])
    assert any(where in path for path, _ in err.value.problems), err.value.problems


def test_effective_limits_show_the_tightest_in_flight_limit() -> None:
    """``mayu policy`` views: the tightest team/user maxInFlight that binds the caller."""
    rules = compile_documents([_doc(_rule("t", SLOTS, kind="team", team="platform"),
                                    _rule("u", {"concurrency": {"maxInFlight": 2}},
                                          kind="user", user="ann"))])
    assert effective_limits(rules, "platform", "ann").max_in_flight == 2
    assert effective_limits(rules, "platform", "bob").max_in_flight == 4


def test_v1_me_lists_a_slot_with_what_is_open_and_no_reset() -> None:
    """``GET /v1/me`` shows an in-flight limit as its limit, the requests open now
    (reserved) and what remains; it has no window to reset."""
    snap = _snapshot(_rule("k", SLOTS, kind="key", key="*"))
    [charge] = [c for c in plan_charges(_principal(), snap, token_bound=0, usd_bound=0,
                                        now=NOW) if is_slot(c)]
    entry = limit_entry(charge, StoredFigures(now_us=0, reserved=3))
    assert (entry["window"], entry["limit"], entry["reserved"], entry["remaining"],
            entry["resets_at"], entry["owner"], entry["scope"]) == (
        "in_flight", 4, 3, 1, None, "policy", "key=key_a")
