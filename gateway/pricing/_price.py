"""Exact money arithmetic: µUSD per million tokens in, integer µUSD out.

A price is given per usage class in µUSD per million tokens. The cost of one class is
``tokens * price / 1_000_000`` rounded half-even to an integer µUSD; the request's cost is
the sum of its classes. Only integers are used, so no float ever touches money.

Usage comes from an upstream and is untrusted: :meth:`Usage.validate` rejects negative
classes and absurd totals before any counter is touched.
"""

from __future__ import annotations

import msgspec

from gateway.ceilings import MAX_TOKENS_PER_CLASS

CLASSES = ("input", "output", "cache_read", "cache_write_5m", "cache_write_1h")


class InvalidUsage(ValueError):
    """Usage reported by an upstream is negative, overflowing or absurd."""


class ModelPrice(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """µUSD per million tokens, per usage class (integers: 2_500_000 = $2.50/Mtok)."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0

    def per_class(self, name: str) -> int:
        return int(getattr(self, name))

    def max_input_price(self) -> int:
        """The most expensive class an input-side token could land in."""
        return max(self.input, self.cache_read, self.cache_write_5m, self.cache_write_1h)


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts per class, as the upstream reported them.

    ``input`` excludes cached tokens (Anthropic's convention; OpenAI's ``prompt_tokens``
    is normalised by subtracting ``cached_tokens``). ``cache_write_unknown`` counts cache
    writes whose TTL the upstream did not report: their token count is known, their price
    is not (DESIGN §5, "tokens known, price uncertain").
    """

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0
    cache_write_unknown: int = 0

    def total_tokens(self) -> int:
        return (self.input + self.output + self.cache_read + self.cache_write_5m
                + self.cache_write_1h + self.cache_write_unknown)

    @property
    def price_certain(self) -> bool:
        return self.cache_write_unknown == 0

    def validate(self) -> Usage:
        for name in (*CLASSES, "cache_write_unknown"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidUsage(f"usage class {name} is not an integer: {value!r}")
            if value < 0:
                raise InvalidUsage(f"usage class {name} is negative: {value}")
            if value > MAX_TOKENS_PER_CLASS:
                raise InvalidUsage(f"usage class {name} is absurdly large: {value}")
        return self


def _div_half_even(numerator: int, denominator: int) -> int:
    """Integer division of non-negative ints, rounding half to even."""
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient


def class_cost_micro_usd(tokens: int, price_per_mtok: int) -> int:
    """Cost of ``tokens`` at ``price_per_mtok`` µUSD per million, rounded half-even."""
    return _div_half_even(tokens * price_per_mtok, 1_000_000)


def cost_micro_usd(usage: Usage, price: ModelPrice) -> int:
    """Exact cost of known-price usage: per-class round-half-even, summed.

    Cache writes of unknown TTL are priced at the most expensive write class, which makes
    this an upper bound when ``usage.price_certain`` is false.
    """
    usage.validate()
    total = sum(class_cost_micro_usd(getattr(usage, name), price.per_class(name))
                for name in CLASSES)
    if usage.cache_write_unknown:
        total += class_cost_micro_usd(usage.cache_write_unknown,
                                      max(price.cache_write_5m, price.cache_write_1h))
    return total


def cost_range_micro_usd(usage: Usage, price: ModelPrice) -> tuple[int, int]:
    """(cheapest, dearest) exact cost this usage can have: the cache writes of unknown
    TTL folded into the 5m and into the 1h class (the provider bills each class once, so
    they are rounded with it, not apart). Equal when ``usage.price_certain``."""
    usage.validate()
    if not usage.cache_write_unknown:
        cost = cost_micro_usd(usage, price)
        return cost, cost
    as_5m = msgspec.structs.replace(usage, cache_write_unknown=0,
                                    cache_write_5m=usage.cache_write_5m
                                    + usage.cache_write_unknown)
    as_1h = msgspec.structs.replace(usage, cache_write_unknown=0,
                                    cache_write_1h=usage.cache_write_1h
                                    + usage.cache_write_unknown)
    low, high = cost_micro_usd(as_5m, price), cost_micro_usd(as_1h, price)
    return min(low, high), max(low, high)


INPUT_CLASSES: frozenset[str] = frozenset(
    ("input", "cache_read", "cache_write_5m", "cache_write_1h"))
"""Every class an input-side token can land in (the default of the bound: all of them)."""

WRITE_CLASSES: frozenset[str] = frozenset(("cache_write_5m", "cache_write_1h"))


def input_price_bound(price: ModelPrice, input_classes: frozenset[str]) -> int:
    """The dearest µUSD/Mtok among ``input_classes``: what one input token may cost."""
    unknown = input_classes - INPUT_CLASSES
    if unknown or not input_classes:
        raise ValueError(f"input_classes must be a non-empty subset of "
                         f"{sorted(INPUT_CLASSES)}, got {sorted(input_classes)}")
    return max(price.per_class(name) for name in input_classes)


def cost_bound_micro_usd(input_bound: int, output_bound: int, price: ModelPrice, *,
                         input_classes: frozenset[str] = INPUT_CLASSES) -> int:
    """A µUSD bound no outcome of these token bounds, its input landing only in
    ``input_classes``, can exceed (``gateway.ingress._bounds.input_classes`` decides them
    from the request; the default, every input class, is sound for any request).

    Every input-side token is priced at the dearest allowed class, rounded up, and the
    output likewise. Each class the cost is rounded in adds at most half a µUSD over its
    exact value, so one µUSD per class that can appear covers rounding: the output, each
    allowed input class, and, when a cache write is allowed, the writes of unknown TTL
    (``cost_micro_usd`` rounds them as a class of their own). With every class allowed
    that is ``len(CLASSES) + 1``, as before.
    """
    per_token = input_price_bound(price, input_classes)
    inp = -(-input_bound * per_token // 1_000_000)
    out = -(-output_bound * price.output // 1_000_000)
    rounded = 1 + len(input_classes) + (1 if input_classes & WRITE_CLASSES else 0)
    return inp + out + rounded
