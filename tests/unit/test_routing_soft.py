"""The soft tier's pieces in process: the config checks, the plan per tier, the capability
floor and the cached read of a soft budget (reserved never counts)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from gateway.config import ModelSettings
from gateway.config._routing import check_soft_tier
from gateway.governance import Charge, StoredFigures
from gateway.routing import STANDARD, Router, SoftBudgets, TierChoice, choose_tier, lacks

CHEAP = {"input": 1, "output": 1}
SOFT = TierChoice(tier="soft", budget="acct")


def _model(soft: dict[str, Any] | None, *deployments: dict[str, Any]) -> ModelSettings:
    deployments = deployments or ({"provider": "a", "name": "a"},
                                  {"provider": "b", "name": "b"},
                                  {"provider": "c", "name": "c", "price": CHEAP})
    routing: dict[str, Any] = {"strategy": "ordered"}
    if soft is not None:
        routing["soft_tier"] = soft
    return msgspec.convert({"name": "m", "deployments": list(deployments),
                            "routing": routing}, ModelSettings)


def _order(router: Router, model: ModelSettings, tier: TierChoice) -> list[str]:
    plan = router.plan(model, [(d, d.provider) for d in model.deployments], tier=tier)
    return [p for _, p in plan.order]


def test_the_soft_tier_serves_only_callers_past_a_soft_budget() -> None:
    """Standard leaves the soft-tier deployment out; soft puts it first and keeps the
    others as its fallbacks; the plan says which tier each deployment is."""
    model = _model({"deployments": ["c"]})
    router = Router()
    assert _order(router, model, STANDARD) == ["a", "b"]
    assert _order(router, model, SOFT) == ["c", "a", "b"]
    plan = router.plan(model, [(d, d.provider) for d in model.deployments], tier=SOFT)
    assert [plan.tier_of(d) for d, _ in plan.order] == ["soft", "standard", "standard"]
    plain = _model(None)
    assert router.plan(plain, [(plain.deployments[0], "a")]).tier_of(
        plain.deployments[0]) is None


@pytest.mark.parametrize(("soft", "wrong"), [
    ({"deployments": ["z"]}, "'z' is not one of the model's deployments (a, b, c)"),
    ({"deployments": ["a"]}, "'a' needs its own price"),
    ({"deployments": []}, "name at least one deployment"),
])
def test_a_soft_tier_must_name_priced_deployments_of_its_model(
        soft: dict[str, Any], wrong: str) -> None:
    """An unknown name, a deployment without its own price, an empty list: refused,
    naming the field."""
    problem = check_soft_tier("models[0]", _model(soft))
    assert problem is not None and wrong in problem
    assert problem.startswith("models[0].routing.soft_tier.deployments: ")


def test_a_soft_tier_of_every_deployment_is_refused() -> None:
    """A soft tier leaves the model's usual deployments out of it."""
    model = _model({"deployments": ["c"]}, {"provider": "c", "name": "c", "price": CHEAP})
    assert "every deployment is in the soft tier" in (check_soft_tier("models[0]", model)
                                                       or "")


def test_the_capability_floor_keeps_what_the_tier_cannot_serve() -> None:
    """Tools on a tier without them, or an input bound above the tier's context window
    (its own setting, else the catalog's figure of its upstream model), keep the
    request on its deployments."""
    model = _model({"deployments": ["c"], "max_input_tokens": 1000, "tools": False})
    tier = model.routing.soft_tier  # type: ignore[union-attr]
    assert tier is not None
    assert lacks(model, tier, input_tokens=1000, tools=False) is None
    assert lacks(model, tier, input_tokens=1001, tools=False) == "context window"
    assert lacks(model, tier, input_tokens=10, tools=True) == "tools"
    haiku = _model({"deployments": ["c"]}, {"provider": "a", "name": "a"},
                   {"provider": "c", "name": "c", "price": CHEAP,
                    "upstream_model": "claude-haiku-4-5"})
    tier = haiku.routing.soft_tier  # type: ignore[union-attr]
    assert tier is not None
    assert lacks(haiku, tier, input_tokens=200_000, tools=True) is None
    assert lacks(haiku, tier, input_tokens=200_001, tools=True) == "context window"


class _Store:
    """Figures a test sets; counts its reads."""

    def __init__(self) -> None:
        self.held: dict[str, StoredFigures] = {}
        self.reads = 0

    async def figures(self, charges: list[Charge]) -> dict[str, StoredFigures]:
        self.reads += 1
        await asyncio.sleep(0.01)
        return {c.counter: self.held.get(c.counter, StoredFigures(now_us=0))
                for c in charges}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _account(limit: int) -> Charge:
    return Charge(counter="acct", kind="account", dimension="usd", amount=0, limit=limit,
                  window="2026-12-07", rule_uid="p/soft", hard=False)


def test_reserved_never_passes_a_soft_budget_committed_and_liability_do() -> None:
    """A billion µUSD reserved with 999 committed + liability is under a 1,000 limit;
    1,000 committed + liability is past it."""
    async def run() -> None:
        clock, store = Clock(), _Store()
        budgets = SoftBudgets(clock=clock)
        charge = [_account(1000)]
        store.held["acct"] = StoredFigures(now_us=0, reserved=10**9, committed=600,
                                           liability=399)
        assert await budgets.past(store, charge, 0) is None  # type: ignore[arg-type]
        store.held["acct"] = StoredFigures(now_us=0, reserved=0, committed=600,
                                           liability=400)
        assert await budgets.past(store, charge, 0) == "acct"  # type: ignore[arg-type]
    asyncio.run(run())


def test_the_read_is_cached_for_max_age_and_shared_by_concurrent_requests() -> None:
    """Twenty concurrent requests make one read; within max_age_s none; after it one."""
    async def run() -> None:
        clock, store = Clock(), _Store()
        budgets = SoftBudgets(clock=clock)
        model = _model({"deployments": ["c"], "max_age_s": 0.25})
        charge = [_account(1000)]
        store.held["acct"] = StoredFigures(now_us=0, committed=1000)
        choices = await asyncio.gather(*(
            choose_tier(budgets, store, model, charge,  # type: ignore[arg-type]
                        input_tokens=10, tools=False) for _ in range(20)))
        assert {c.tier for c in choices} == {"soft"} and store.reads == 1
        store.held["acct"] = StoredFigures(now_us=0, committed=0)  # a new day, say
        clock.t += 0.24
        assert (await choose_tier(budgets, store, model, charge,  # type: ignore[arg-type]
                                  input_tokens=10, tools=False)).tier == "soft"
        clock.t += 0.01
        assert (await choose_tier(budgets, store, model, charge,  # type: ignore[arg-type]
                                  input_tokens=10, tools=False)) == STANDARD
        assert store.reads == 2
        assert await choose_tier(budgets, store, model, [],  # type: ignore[arg-type]
                                 input_tokens=10, tools=False) == STANDARD
        assert store.reads == 2  # no soft budget binds: nothing read
    asyncio.run(run())


def test_the_docs_soft_tier_example_is_a_valid_soft_tier() -> None:
    """docs/routing.md's soft tier example decodes and passes the config's soft tier
    check; its policy rule is a soft budget."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "routing.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    config = next(yaml.safe_load(b) for b in blocks if "soft_tier:" in b)
    model = msgspec.convert(config["models"][0], ModelSettings)
    assert check_soft_tier("models[0]", model) is None
    policy = next(yaml.safe_load(b) for b in blocks if "hardCap: false" in b)
    assert policy["spec"]["rules"][0]["budget"]["hardCap"] is False
