"""Integer µUSD pricing: per-class round-half-even, the admission bound (over every input
class, or only the classes a request can produce), usage validation."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gateway.pricing import (
    CLASSES,
    InvalidUsage,
    ModelPrice,
    Usage,
    class_cost_micro_usd,
    cost_bound_micro_usd,
    cost_micro_usd,
    cost_range_micro_usd,
)
from gateway.pricing._price import (
    INPUT_CLASSES,
    MAX_TOKENS_PER_CLASS,
    WRITE_CLASSES,
    input_price_bound,
)

tokens = st.integers(min_value=0, max_value=MAX_TOKENS_PER_CLASS)
prices = st.integers(min_value=0, max_value=1_000_000_000)  # up to $1000 per Mtok
model_prices = st.builds(ModelPrice, input=prices, output=prices, cache_read=prices,
                         cache_write_5m=prices, cache_write_1h=prices)
# Rounding only pushes a cost over a naive bound when several classes share the top
# price and each rounds up, so draw such price sheets on purpose as well.
flat_prices = prices.map(lambda p: ModelPrice(input=p, output=p, cache_read=p,
                                              cache_write_5m=p, cache_write_1h=p))
any_prices = st.one_of(model_prices, flat_prices)


def oracle(n: int, price: int) -> int:
    """Decimal's ROUND_HALF_EVEN, an independent implementation of the same rule."""
    exact = Decimal(n) * Decimal(price) / Decimal(1_000_000)
    return int(exact.quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


@given(tokens, prices)
def test_class_cost_is_round_half_even(n, price):
    """One class's cost equals tokens * price / 1e6 rounded half to even, as an int."""
    cost = class_cost_micro_usd(n, price)
    assert type(cost) is int
    assert cost == oracle(n, price)


@pytest.mark.parametrize(("n", "price", "expected"), [
    (1, 500_000, 0),      # 0.5 -> 0 (even)
    (3, 500_000, 2),      # 1.5 -> 2 (even)
    (5, 500_000, 2),      # 2.5 -> 2 (even)
    (1, 2_500_000, 2),    # 2.5 -> 2
    (1, 2_500_001, 3),    # just above half rounds up
    (1_000_000, 3_000_000, 3_000_000),
])
def test_class_cost_examples(n, price, expected):
    """Known half-even cases, including exact halves both ways."""
    assert class_cost_micro_usd(n, price) == expected


@st.composite
def usage_within(draw):
    """Bounds, and a usage any real outcome of those bounds could report."""
    input_bound = draw(st.integers(min_value=0, max_value=10**9))
    output_bound = draw(st.integers(min_value=0, max_value=10**9))
    cuts = sorted(draw(st.lists(st.integers(min_value=0, max_value=input_bound),
                                min_size=4, max_size=4)))
    parts = [b - a for a, b in zip([0, *cuts], [*cuts, input_bound], strict=True)]
    # Usually every input token is used (the worst case); sometimes only part of them.
    used = draw(st.sampled_from([5, 5, 5, 0, 1, 2, 3, 4]))
    parts = [p * used // 5 for p in parts]
    usage = Usage(input=parts[0], cache_read=parts[1], cache_write_5m=parts[2],
                  cache_write_1h=parts[3], cache_write_unknown=parts[4],
                  output=draw(st.integers(min_value=0, max_value=output_bound)))
    return input_bound, output_bound, usage


@given(usage_within(), any_prices)
@example((6, 0, Usage(input=3, cache_read=3)), ModelPrice(input=500_000, cache_read=500_000))
@example((15, 0, Usage(input=3, cache_read=3, cache_write_5m=3, cache_write_1h=3,
                       cache_write_unknown=3)),
         ModelPrice(input=500_000, cache_read=500_000, cache_write_5m=500_000,
                    cache_write_1h=500_000))
def test_cost_never_exceeds_the_admission_bound(case, price):
    """For any usage within the token bounds, in any mix of classes, cost <= bound."""
    input_bound, output_bound, usage = case
    assert usage.total_tokens() - usage.output <= input_bound
    cost = cost_micro_usd(usage, price)
    bound = cost_bound_micro_usd(input_bound, output_bound, price)
    assert type(cost) is int and type(bound) is int
    assert cost <= bound


@given(st.dictionaries(st.sampled_from(CLASSES), tokens), model_prices)
def test_cost_is_the_sum_of_rounded_classes(counts, price):
    """A request's cost is the sum of its per-class rounded costs (not rounded once)."""
    usage = Usage(**counts)
    expected = sum(oracle(counts.get(c, 0), price.per_class(c)) for c in CLASSES)
    assert cost_micro_usd(usage, price) == expected


def test_unknown_ttl_cache_writes_are_priced_at_the_dearer_write_class():
    """cache_write_unknown costs as the most expensive cache-write class."""
    price = ModelPrice(cache_write_5m=1_250_000, cache_write_1h=2_000_000)
    usage = Usage(cache_write_unknown=1_000_000)
    assert not usage.price_certain
    assert cost_micro_usd(usage, price) == 2_000_000


@pytest.mark.parametrize("bad", [
    {"input": -1}, {"output": -5}, {"cache_read": MAX_TOKENS_PER_CLASS + 1},
    {"cache_write_unknown": -1}, {"input": True}, {"output": 1.0},
])
def test_invalid_usage_is_rejected_naming_the_class(bad):
    """Negative, absurd or non-integer classes raise InvalidUsage naming the class."""
    [name] = bad
    with pytest.raises(InvalidUsage, match=name):
        Usage(**bad).validate()


def _old_bound(input_bound: int, output_bound: int, price: ModelPrice) -> int:
    """The bound before input classes were narrowed: all input at the dearest class."""
    return (-(-input_bound * price.max_input_price() // 1_000_000)
            - (-output_bound * price.output // 1_000_000) + len(CLASSES) + 1)


@given(st.integers(0, 10**9), st.integers(0, 10**9), any_prices)
def test_the_default_bound_is_the_all_classes_bound(inp: int, out: int,
                                                    price: ModelPrice) -> None:
    """Without input_classes the bound is unchanged: every input token at the dearest class."""
    assert cost_bound_micro_usd(inp, out, price) == _old_bound(inp, out, price)
    assert cost_bound_micro_usd(inp, out, price, input_classes=INPUT_CLASSES) \
        == _old_bound(inp, out, price)


class_sets = st.sets(st.sampled_from(sorted(INPUT_CLASSES)), min_size=1).map(frozenset)


@st.composite
def usage_in_classes(draw: st.DrawFn) -> tuple[frozenset[str], int, int, Usage]:
    """Allowed input classes, bounds, and a usage whose input lands only in those classes
    (writes of unknown TTL only if a write class is allowed)."""
    allowed = draw(class_sets)
    input_bound = draw(st.integers(min_value=0, max_value=10**9))
    output_bound = draw(st.integers(min_value=0, max_value=10**9))
    names = sorted(allowed) + (["cache_write_unknown"]
                               if allowed & {"cache_write_5m", "cache_write_1h"} else [])
    cuts = sorted(draw(st.lists(st.integers(min_value=0, max_value=input_bound),
                                min_size=len(names) - 1, max_size=len(names) - 1)))
    parts = [b - a for a, b in zip([0, *cuts], [*cuts, input_bound], strict=True)]
    used = draw(st.sampled_from([5, 5, 5, 0, 1, 2, 3, 4]))
    counts = {n: p * used // 5 for n, p in zip(names, parts, strict=True)}
    usage = Usage(**counts, output=draw(st.integers(min_value=0, max_value=output_bound)))
    return allowed, input_bound, output_bound, usage


def _readings(usage: Usage, allowed: frozenset[str]) -> list[Usage]:
    """Every way the usage can have been billed: writes of unknown TTL in any allowed
    write class (the provider bills the TTL a breakpoint asked for)."""
    if not usage.cache_write_unknown:
        return [usage]
    known = {c: getattr(usage, c) for c in CLASSES}
    return [Usage(**{**known, into: known[into] + usage.cache_write_unknown})
            for into in sorted(allowed & WRITE_CLASSES)]


@given(usage_in_classes(), any_prices)
@example((frozenset({"input", "cache_read"}), 2, 0, Usage(input=1, cache_read=1)),
         ModelPrice(input=1_500_000, cache_read=1_500_000))
@example((frozenset({"input", "cache_read", "cache_write_5m"}), 4, 0,
          Usage(input=1, cache_read=1, cache_write_5m=1, cache_write_unknown=1)),
         ModelPrice(input=1_500_000, cache_read=1_500_000, cache_write_5m=1_500_000))
def test_cost_within_the_allowed_classes_never_exceeds_their_bound(
        case: tuple[frozenset[str], int, int, Usage], price: ModelPrice) -> None:
    """Input landing only in the allowed classes costs at most the bound of those classes
    (rounding included), whatever allowed TTL unsplit writes had; the settlement's
    committed figure too; and with both write classes allowed, so is the dearest reading
    of writes of unknown TTL (committed + liability)."""
    allowed, input_bound, output_bound, usage = case
    bound = cost_bound_micro_usd(input_bound, output_bound, price, input_classes=allowed)
    low, high = cost_range_micro_usd(usage, price)
    assert all(cost_micro_usd(u, price) <= bound for u in _readings(usage, allowed))
    assert low <= bound
    if allowed >= WRITE_CLASSES or not usage.cache_write_unknown:
        assert high <= bound and cost_micro_usd(usage, price) <= bound


@pytest.mark.parametrize(("allowed", "slack"), [
    ({"input"}, 2),
    ({"input", "cache_read"}, 3),
    ({"input", "cache_read", "cache_write_5m"}, 5),
    (INPUT_CLASSES, 6),
])
def test_rounding_slack_is_one_micro_usd_per_class_that_can_appear(
        allowed: set[str], slack: int) -> None:
    """The bound adds 1 µUSD per rounded class: output, each allowed input class, and the
    unknown-TTL writes when a write is allowed."""
    assert cost_bound_micro_usd(0, 0, ModelPrice(), input_classes=frozenset(allowed)) == slack


def test_input_is_priced_at_the_dearest_allowed_class_only() -> None:
    """A Claude-priced request allowed input and reads is bounded at the input price,
    not at the 1h write price."""
    price = ModelPrice(input=3_000_000, output=15_000_000, cache_read=300_000,
                       cache_write_5m=3_750_000, cache_write_1h=6_000_000)
    plain = frozenset({"input", "cache_read"})
    assert input_price_bound(price, plain) == 3_000_000
    assert input_price_bound(price, plain | {"cache_write_5m"}) == 3_750_000
    assert cost_bound_micro_usd(1_000_000, 1000, price, input_classes=plain) \
        == 3_000_000 + 15_000 + 3
    assert cost_bound_micro_usd(1_000_000, 1000, price) == 6_000_000 + 15_000 + 6


@pytest.mark.parametrize("allowed", [frozenset(), frozenset({"output"}),
                                     frozenset({"input", "cache_write_unknown"})])
def test_input_classes_outside_the_input_side_are_refused(allowed: frozenset[str]) -> None:
    """An empty set, or a class that is not an input class, is a caller bug: ValueError."""
    with pytest.raises(ValueError, match="input_classes"):
        cost_bound_micro_usd(1, 1, ModelPrice(), input_classes=allowed)
