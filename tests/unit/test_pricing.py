"""Integer µUSD pricing: per-class round-half-even, the admission bound, usage validation."""

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
)
from gateway.pricing._price import MAX_TOKENS_PER_CLASS

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
