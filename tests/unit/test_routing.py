"""Routing: balancing, health (cooldown, circuit breaker), session keys and affinity."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from gateway.config import Deployment, ModelSettings
from gateway.routing import Dedupe, Router, Shared, VolatileStore, session_of


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _model(*deployments: dict[str, Any], **routing: Any) -> ModelSettings:
    return msgspec.convert({"name": "m", "deployments": list(deployments),
                            "routing": {"cooldown_s": 10, "max_cooldown_s": 40, **routing}},
                           ModelSettings)


def _cands(model: ModelSettings) -> list[tuple[Deployment, str]]:
    return [(d, d.provider) for d in model.deployments]


def _first(router: Router, model: ModelSettings, **kw: Any) -> str:
    return router.plan(model, _cands(model), **kw).order[0][1]


def test_weighted_round_robin_follows_the_weights() -> None:
    """Weights 3:1 give three requests to one deployment for each to the other."""
    model = _model({"provider": "a", "weight": 3}, {"provider": "b", "weight": 1})
    router = Router(clock=Clock())
    assert Counter(_first(router, model) for _ in range(40)) == {"a": 30, "b": 10}


def test_a_failure_cools_a_deployment_down_then_one_probe_closes_the_circuit() -> None:
    """After a failure new requests go elsewhere for the cooldown; then one probe at a time
    is let through, and its success restores the balance."""
    clock = Clock()
    model = _model({"provider": "a"}, {"provider": "b"})
    router = Router(clock=clock)
    a = model.deployments[0]
    router.failed(model, a, retry_after_s=None, why="HTTP 503")
    plans = [router.plan(model, _cands(model)) for _ in range(6)]
    assert {p.order[0][1] for p in plans} == {"b"}
    assert all(p.order[-1][1] == "a" for p in plans)  # a last resort, never dropped
    clock.t += 10
    assert _first(router, model) == "a"  # half-open: the probe
    router.sent(model, a)
    assert _first(router, model) == "b"  # one probe at a time
    router.succeeded(model, a)
    router.left(model, a)
    assert Counter(_first(router, model) for _ in range(10)) == {"a": 5, "b": 5}


def test_failures_in_a_row_double_the_cooldown_and_retry_after_lengthens_it() -> None:
    """The cooldown doubles per failure in a row up to max_cooldown_s, and is never
    shorter than the upstream's retry-after."""
    clock = Clock()
    model = _model({"provider": "a"}, {"provider": "b"})
    router = Router(clock=clock)
    a = model.deployments[0]
    for expected in (10, 20, 40, 40):
        router.failed(model, a, retry_after_s=None, why="x")
        assert router.snapshot(model)["a/m"]["cooling_s"] == expected
        clock.t += expected
    router.succeeded(model, a)
    router.failed(model, a, retry_after_s=25, why="429")
    assert router.snapshot(model)["a/m"]["cooling_s"] == 25


def test_a_full_deployment_comes_after_those_with_room() -> None:
    """At its max_inflight a deployment is tried only after the ones with headroom."""
    model = _model({"provider": "a", "max_inflight": 1}, {"provider": "b"},
                   strategy="ordered")
    router = Router(clock=Clock())
    router.sent(model, model.deployments[0])
    assert [p for _, p in router.plan(model, _cands(model)).order] == ["b", "a"]
    router.left(model, model.deployments[0])
    assert _first(router, model) == "a"


def test_a_model_without_routing_keeps_the_listed_order() -> None:
    """No ``routing``: the listed order whatever happened before (the old behaviour)."""
    model = msgspec.convert({"name": "m", "deployments": [{"provider": "a"},
                                                          {"provider": "b"}]}, ModelSettings)
    router = Router(clock=Clock())
    router.failed(model, model.deployments[0], retry_after_s=None, why="x")
    assert [p for _, p in router.plan(model, _cands(model)).order] == ["a", "b"]


def _turn(n: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for i in range(n):
        messages += [{"role": "user", "content": [{"type": "text", "text": f"q{i}"}]},
                     {"role": "assistant", "content": f"a{i}"}]
    messages.pop()
    messages[-1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    return {"model": "m", "system": [{"type": "text", "text": "sys",
                                      "cache_control": {"type": "ephemeral"}}],
            "messages": messages}


def test_session_keys_come_from_the_agents_own_identity() -> None:
    """Claude Code's header and its metadata name one session; Codex's header and
    prompt_cache_key name theirs; a 1h breakpoint makes the pin live an hour."""
    sid = "54c1eb09-bc4c-4d2f-98eb-6d2ab2d5e2fe"
    header = session_of("m", {"x-claude-code-session-id": sid}, {})
    meta = session_of("m", {}, {"metadata": {"user_id": json.dumps({"session_id": sid})}})
    legacy = session_of("m", {}, {"metadata": {"user_id": f"user_ab_account__session_{sid}"}})
    assert header and meta and legacy
    assert header.pin == meta.pin == legacy.pin and header.source == "header"
    assert session_of("other", {"x-claude-code-session-id": sid}, {}).pin != header.pin  # type: ignore[union-attr]
    codex = session_of("m", {"session-id": "c1"}, {})
    pck = session_of("m", {}, {"prompt_cache_key": "c1"})
    assert codex and pck and codex.pin != pck.pin
    hour = _turn(1)
    hour["system"][0]["cache_control"]["ttl"] = "1h"
    assert session_of("m", {"session_id": "x"}, hour).ttl_s == 3600  # type: ignore[union-attr]
    assert session_of("m", {}, {"messages": [{"role": "user", "content": "hi"}]}) is None


def test_the_next_turn_finds_the_previous_turns_prefix_pin() -> None:
    """Without a session identity the prefix hash is the key; turn 2 looks up the boundary
    where turn 1's last breakpoint was."""
    one, two = session_of("m", {}, _turn(1)), session_of("m", {}, _turn(2))
    assert one is not None and two is not None and one.source == "prefix"
    assert one.pin in two.lookup and two.pin != one.pin


def _affine(conflict: str, **extra: Any) -> ModelSettings:
    return _model({"provider": "a", "max_inflight": 1}, {"provider": "b"}, {"provider": "c"},
                  affinity=True, on_affinity_conflict=conflict, affinity_wait_s=5, **extra)


def test_affinity_keeps_a_session_on_its_deployment_but_never_revives_a_cooling_one() -> None:
    """A pinned session goes back to its deployment while it is usable; once that one's
    circuit is open (failures in a row) the session moves, and is pinned where it lands."""
    model = _affine("preferFallback")
    router = Router(clock=Clock())
    session = session_of("m", {"session-id": "s1"}, {})
    plan = router.plan(model, _cands(model), session=session)
    plan.served(plan.order[1][0])
    landed = plan.order[1][1]
    assert all(_first(router, model, session=session) == landed for _ in range(5))
    pinned = next(d for d, p in _cands(model) if p == landed)
    router.failed(model, pinned, retry_after_s=None, why="x")
    router.failed(model, pinned, retry_after_s=None, why="x")
    moved = router.plan(model, _cands(model), session=session)
    assert moved.order[0][1] != landed and moved.wait_for is None


@pytest.mark.parametrize("conflict", ["preferAffinity", "preferFallback"])
async def test_a_full_pinned_deployment_is_waited_for_only_under_prefer_affinity(
        conflict: str) -> None:
    """preferAffinity waits (within affinity_wait_s) for the pinned deployment's room;
    preferFallback moves at once."""
    model = _affine(conflict)
    router = Router()
    a = model.deployments[0]
    session = session_of("m", {"session-id": "s2"}, {})
    assert session is not None
    router.pin(model, session, a)
    router.sent(model, a)  # a is full
    plan = router.plan(model, _cands(model), session=session)
    assert plan.order[0][1] != "a"
    if conflict == "preferFallback":
        assert plan.wait_for is None
        return
    assert plan.wait_for == "a/m"
    waiting = asyncio.create_task(plan.settle_affinity())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    router.left(model, a)
    await asyncio.wait_for(waiting, timeout=10)
    assert plan.order[0][1] == "a"


def test_affinity_needs_an_explicit_conflict_rule() -> None:
    """ADR-031: neither affinity nor fallback wins by default."""
    with pytest.raises(msgspec.ValidationError, match="on_affinity_conflict"):
        _model({"provider": "a"}, affinity=True)


async def test_dedupe_shares_one_answer_with_a_bounded_number_of_waiters() -> None:
    """Waiters beyond dedupe_waiters lead nothing and wait for nothing; the payload is
    released once handed over; a leader without an answer frees its waiters."""
    dedupe = Dedupe(store=VolatileStore(max_entries=1))
    key = dedupe.key("team", "messages", b"{}")
    flight = dedupe.lead(key, "req_1")
    assert flight is not None and dedupe.lead(dedupe.key("t2", "messages", b"{}"), "r") is None
    waiters = [dedupe.follow(key, max_waiters=2) for _ in range(3)]
    assert waiters[0] is flight and waiters[1] is flight and waiters[2] is None
    answer = Shared(request_id="req_1", status=200, headers={}, content_type="json",
                    data=b"x" * 10)
    dedupe.land(key, flight, answer)
    assert await flight.done == answer and dedupe.shared == 2 and len(dedupe.store) == 0
    await asyncio.sleep(0)
    assert dedupe.store.bytes == 0
    again = dedupe.lead(key, "req_2")
    assert again is not None and dedupe.follow(key, max_waiters=2) is again
    dedupe.land(key, again, None)
    assert await again.done is None


def test_the_docs_routing_example_decodes() -> None:
    """docs/routing.md's config example is a valid ``models:`` list, routing included."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "routing.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    models = msgspec.convert(yaml.safe_load(block)["models"], list[ModelSettings])
    routing = models[0].routing
    assert routing is not None and routing.affinity and routing.dedupe
    assert [d.weight for d in models[0].deployments] == [2, 1, 1]
    assert models[0].deployments[2].price is not None
