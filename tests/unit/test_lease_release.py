"""The plane's side of sizing and release (issue 25), without I/O: what a heartbeat asks
for (``want``), which leases it freezes and releases, and the cap's in-flight part."""

from __future__ import annotations

import asyncio

from gateway.governance import AdmissionRequest, Permit, Refusal
from gateway.lease import LeaseState
from tests.unit.test_lease_state import KEY, budget, doc, grant, plan, state_with


def admit(state: LeaseState, usd: int) -> AdmissionRequest:
    req = state.plan(plan(state, usd=usd))
    assert isinstance(req, AdmissionRequest)
    state.admitted(Permit(id=f"p{usd}", request=req))
    return req


def test_want_is_what_admissions_reserved_over_the_last_renew_interval() -> None:
    """Two admissions within the interval are asked for again; older ones are not; a
    refused charge larger than that is the floor."""
    state, clock = state_with(doc("p", budget()))
    state.renewed([grant(10_000)], sent=clock(), heartbeat_ms=1000)
    admit(state, 300)
    clock.now += 0.6
    admit(state, 200)
    assert state.want(KEY, 0) == 500
    clock.now += 0.6
    assert state.want(KEY, 0) == 200
    assert state.want(KEY, 900) == 900


def test_an_idle_or_short_lease_is_frozen_and_reports_what_is_in_flight() -> None:
    """A lease without an admission in the last renew interval is released, as is a busy
    one asked for a charge it could not fit; a busy one that fits is kept. What was
    planned before the freeze and not decided yet is returned for the cap, and the
    frozen lease admits nothing until the answer."""
    state, clock = state_with(doc("p", budget()))
    state.renewed([grant(10_000)], sent=clock(), heartbeat_ms=1000)
    req = admit(state, 300)
    assert state.release({}) == {}  # busy, nothing refused: kept
    held = state.hold(req)
    assert state.release({KEY: ("p/spend", 20_000)}) == {KEY: 300}
    state.unhold(held)
    refused = state.plan(plan(state, usd=1))
    assert isinstance(refused, Refusal) and refused.code == "lease_exhausted"
    assert state.waits(refused)

    state.renewed([grant(10_000)], sent=clock(), heartbeat_ms=1000)
    clock.now += 1.5
    assert state.release({}) == {KEY: 0}  # idle
    assert state.leases[KEY].frozen


def test_a_request_waits_for_the_answer_of_the_heartbeat_that_carries_its_ask() -> None:
    """Frozen: the heartbeat in flight decides it; otherwise the next one to begin. An
    unanswered heartbeat ends the wait too, and then nothing waits until one is answered."""
    async def run() -> None:
        state, clock = state_with(doc("p", budget()))
        state.renewed([grant(10_000)], sent=clock(), heartbeat_ms=1000)
        req = plan(state, usd=5)
        assert state.answer_target(req) == 1  # the next heartbeat
        state.beat_begun()
        state.release({KEY: ("p/spend", 5)})
        assert state.answer_target(req) == 1  # frozen by the one in flight
        waiter = asyncio.create_task(state.next_answer(1))
        await asyncio.sleep(0)
        assert not waiter.done()
        state.beat_ended(answered=False)
        assert await waiter
        assert not state.waits(Refusal(status=503, code="lease_missing", reason="x"))

    asyncio.run(run())


def test_admissions_planned_before_a_release_keep_their_room_under_the_next_lease() -> None:
    """What was in flight when a released lease's answer arrived was checked against the
    older allowance: the new lease clamps new admissions so that room stays free."""
    state, clock = state_with(doc("p", budget()))
    state.renewed([grant(10_000)], sent=clock(), heartbeat_ms=1000)
    held = state.hold(plan(state, usd=300))
    state.release({KEY: ("p/spend", 20_000)})
    state.renewed([grant(1_000)], sent=clock(), heartbeat_ms=1000)
    clamped = state.plan(plan(state, usd=5))
    assert isinstance(clamped, AdmissionRequest)
    (charge,) = [c for c in clamped.charges if c.kind == "account"]
    assert charge.limit == 700
    state.unhold(held)
    state.renewed([grant(1_000)], sent=clock(), heartbeat_ms=1000)  # not frozen: no room kept
    assert state.leases[KEY].reserve == 0
