"""The plane's side of the lease profile without I/O: per-document application of the
distributed set, and clamp-and-gate on admission plans (gateway.lease)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.governance import AdmissionRequest, Permit, Refusal, build_request
from gateway.keys import KeyLimits, Principal, Team, TeamLimits
from gateway.lease import LeaseGrant, LeaseState, apply_documents

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
KEY = "account:p/spend:team=alpha:day:2026-12-01"


def doc(name: str, *rules: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
            "metadata": {"name": name}, "spec": {"rules": list(rules)}}


def budget(name: str = "spend", team: str = "alpha", *, failure: str = "FailClosed",
           hard: bool = True) -> dict[str, Any]:
    return {"name": name, "failurePolicy": failure, "subject": {"kind": "team", "team": team},
            "budget": {"limitMilliUSD": 1000, "window": "day", "hardCap": hard}}


def quota(team: str = "beta") -> dict[str, Any]:
    return {"name": "tokens", "failurePolicy": "FailClosed",
            "subject": {"kind": "team", "team": team}, "tokenQuota": {"day": 100}}


def principal(team: str = "alpha") -> Principal:
    return Principal(key_id="k1", key_prefix="sk-inf-k1", key_revision=1,
                     key_limits=KeyLimits(), allowed_models=None,
                     team=Team(id=f"id-{team}", name=team, limits=TeamLimits()))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def state_with(*docs: dict[str, Any]) -> tuple[LeaseState, Clock]:
    clock = Clock()
    state = LeaseState(clock=clock)
    state.applied = apply_documents({d["metadata"]["name"]: d for d in docs}, namespace="ns",
                                    generation=3, fingerprint="f")
    return state, clock


def plan(state: LeaseState, team: str = "alpha", usd: int = 500) -> AdmissionRequest:
    return build_request(principal(team), state.applied.snapshot, request_id="r", model="m",
                         token_bound=10, usd_bound=usd, now=NOW)


def grant(allowance: int, *, remaining: int = 10_000, renew_ms: int = 1000) -> LeaseGrant:
    return LeaseGrant(key=KEY, rule_uid="p/spend", allowance=allowance, renew_ms=renew_ms,
                      grant=100, remaining=remaining, limit=1_000_000)


def account_charge(req: AdmissionRequest | Refusal) -> Any:
    assert isinstance(req, AdmissionRequest)
    (charge,) = [c for c in req.charges if c.kind == "account"]
    return charge


def test_an_unsupported_document_is_kept_out_and_the_others_apply() -> None:
    """A tokenQuota document is rejected with its path; the budget document applies."""
    applied = apply_documents({"p": doc("p", budget()), "q": doc("q", quota())},
                              namespace="ns", generation=1, fingerprint="f")
    assert [r.name for r in applied.rejections] == ["q"]
    assert applied.rejections[0].problems[0].path == "spec.rules[0].tokenQuota"
    assert "p/spend" in applied.managed and applied.managed["p/spend"].gate is None


def test_a_rejected_failclosed_rule_gates_what_it_covers_and_only_that() -> None:
    """Requests the rejected FailClosed rule would cover are refused (503), naming it;
    other teams are untouched."""
    state, _ = state_with(doc("q", quota("beta")))
    refused = state.plan(plan(state, "beta"))
    assert isinstance(refused, Refusal) and refused.status == 503
    assert refused.code == "rule_unsupported" and "q/tokens" in refused.reason
    assert isinstance(state.plan(plan(state, "alpha")), AdmissionRequest)


def test_a_rejected_failopen_rule_is_dropped_not_gated() -> None:
    """failurePolicy: FailOpen on a rule this plane cannot enforce drops it (no gate)."""
    rule = {**quota("beta"), "failurePolicy": "FailOpen"}
    applied = apply_documents({"q": doc("q", rule)}, namespace="ns", generation=1,
                              fingerprint="f")
    assert applied.rejections and not applied.snapshot.rules


def test_a_document_this_build_cannot_read_gates_by_its_readable_subject() -> None:
    """An unknown rule type (version skew) is rejected; its FailClosed rule still gates the
    subject it names."""
    rule = {"name": "future", "failurePolicy": "FailClosed",
            "subject": {"kind": "team", "team": "beta"}, "futureLimit": {"x": 1}}
    state, _ = state_with(doc("new", rule))
    assert state.applied.rejections[0].name == "new"
    assert isinstance(state.plan(plan(state, "beta")), Refusal)
    assert isinstance(state.plan(plan(state, "alpha")), AdmissionRequest)


def test_a_valid_lease_clamps_the_hard_cap_to_the_allowance() -> None:
    """Within its lease, the account's limit is the allowance (never above the rule's)."""
    state, _ = state_with(doc("p", budget()))
    state.renewed([grant(700)], sent=state.clock(), heartbeat_ms=1000)
    assert account_charge(state.plan(plan(state))).limit == 700


def test_failclosed_without_a_lease_refuses_and_asks_for_one() -> None:
    """No lease yet: 503 lease_missing, and the account is asked for in the next heartbeat
    with the refused charge as its want."""
    state, _ = state_with(doc("p", budget()))
    refused = state.plan(plan(state, usd=500))
    assert isinstance(refused, Refusal) and refused.code == "lease_missing"
    assert state.take_demand() == {KEY: ("p/spend", 500)} and state.wake.is_set()


def test_an_expired_lease_gates_failclosed_and_spares_failopen() -> None:
    """Three renew intervals after the last answer a FailClosed hard cap refuses (503
    lease_expired); a FailOpen one keeps its own limit on local counters."""
    state, clock = state_with(doc("p", budget()))
    state.renewed([grant(700)], sent=clock(), heartbeat_ms=1000)
    clock.now += 3.01
    refused = state.plan(plan(state))
    assert isinstance(refused, Refusal) and refused.code == "lease_expired"
    open_state, open_clock = state_with(doc("p", budget(failure="FailOpen")))
    open_state.renewed([grant(700)], sent=open_clock(), heartbeat_ms=1000)
    open_clock.now += 3.01
    assert account_charge(open_state.plan(plan(open_state))).limit == 1_000_000


def test_soft_caps_are_never_gated() -> None:
    """hardCap: false never refuses, with or without a lease."""
    state, _ = state_with(doc("p", budget(hard=False)))
    assert isinstance(state.plan(plan(state)), AdmissionRequest)


def test_a_plan_from_a_replaced_snapshot_is_a_snapshot_mismatch() -> None:
    """A request planned from an older generation is re-planned (503 snapshot_mismatch)."""
    state, _ = state_with(doc("p", budget()))
    old = plan(state)
    state.applied = apply_documents({}, namespace="ns", generation=4, fingerprint="g")
    refused = state.plan(old)
    assert isinstance(refused, Refusal) and refused.code == "snapshot_mismatch"


@pytest.mark.parametrize(("remaining", "status", "code"), [
    (10_000, 503, "lease_exhausted"), (100, 402, None)])
def test_a_used_up_allowance_is_503_while_the_budget_has_room_else_402(
        remaining: int, status: int, code: str | None) -> None:
    """A local refusal on a leased account: 503 + early renewal when the budget still had
    room for the charge at the last answer, else the 402 with the lease's figures."""
    state, _ = state_with(doc("p", budget()))
    state.renewed([grant(700, remaining=remaining)], sent=state.clock(), heartbeat_ms=1000)
    req = plan(state, usd=500)
    local = Refusal(status=402, code="budget_exhausted", counter=KEY, reason="limit")
    answer = state.refused(req, local)
    assert (answer.status, answer.code) == (status, code or "budget_exhausted")
    if status == 402:
        assert "lease allowance 700" in answer.reason
    else:
        assert state.take_demand() == {KEY: ("p/spend", 500)}


def test_admissions_below_half_a_grant_of_headroom_ask_for_an_early_renewal() -> None:
    """The heartbeat is woken once what was admitted leaves under half a grant."""
    state, _ = state_with(doc("p", budget()))
    state.renewed([grant(700)], sent=state.clock(), heartbeat_ms=1000)
    state.wake.clear()
    req = state.plan(plan(state, usd=660))
    assert isinstance(req, AdmissionRequest)
    state.admitted(Permit(id="x", request=req))
    assert state.wake.is_set()


def test_heartbeats_report_the_previous_windows_too() -> None:
    """Right after midnight (and the first of a month) the ended day and month are still
    reported, so their late settlements reach the ledger."""
    from gateway.lease._client import _previous_periods

    assert _previous_periods(datetime(2026, 12, 1, 0, 0, 5, tzinfo=UTC)) == (
        "2026-11-30", "2026-11")
    assert _previous_periods(datetime(2026, 1, 1, 0, 0, tzinfo=UTC)) == (
        "2025-12-31", "2025-12")


def test_a_counter_is_reported_only_for_a_lease_managed_rule() -> None:
    """Only ``account:`` counters of the applied budget rules go into a heartbeat."""
    from gateway.lease._client import _uid_of

    assert _uid_of(KEY, {"p/spend"}) == "p/spend"
    assert _uid_of(KEY, {"other/rule"}) is None
    assert _uid_of("team:t1:usd:day:2026-12-01", {"p/spend"}) is None


def test_an_account_rolls_into_the_coming_window_only_when_its_window_ends() -> None:
    """Near midnight the day account is also asked for in the next day; a month account
    only rolls at the end of the month."""
    from gateway.lease._client import _rolled

    now, ahead = ("2026-12-01", "2026-12"), ("2026-12-02", "2026-12")
    assert _rolled(KEY, now, ahead) == "account:p/spend:team=alpha:day:2026-12-02"
    month_key = "account:p/spend:team=alpha:month:2026-12"
    assert _rolled(month_key, now, ahead) == month_key
    assert _rolled(month_key, ("2026-12-31", "2026-12"), ("2027-01-01", "2027-01")) == (
        "account:p/spend:team=alpha:month:2027-01")
