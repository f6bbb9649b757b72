"""Most-restrictive-wins view of the rules that apply to one caller.

Enforcement never merges: every applicable rule is charged on its own counters, so the
tightest one binds by construction. This module computes the *effective* limits for
display (``/v1alpha1`` views, ``mayu policy``, docs) and for lease cadence, with the two
ADR-039 merge bugs designed out rather than patched:

- an ``unlimited`` rule has its own branch and never reaches the min accumulator, so it
  cannot erase or widen a real cap whatever order the documents come in;
- unlimited rules have nothing to lease and take no part in the renew-interval
  computation, so they cannot discard a real rule's ``renewInterval``.

``None`` always means "no cap on this dimension"; ``0`` is never used as a sentinel.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from gateway.policy._compiled import CompiledRule


class EffectiveLimits(msgspec.Struct, frozen=True, kw_only=True):
    rpm: int | None = None
    tpm: int | None = None
    budget_day_micro_usd: int | None = None
    budget_month_micro_usd: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    max_in_flight: int | None = None
    """Team and user concurrency rules (key rules bind keys, not this view's caller)."""
    lease_renew_ms: int | None = None
    """Tightest heartbeat interval among the real lease-managed budget rules."""
    unlimited: tuple[str, ...] = ()
    """Rule kinds some applicable rule declares deliberately uncapped (sorted)."""
    rules: tuple[str, ...] = ()
    """uids of every applicable rule, unlimited ones included (sorted)."""


def _min(current: int | None, value: int | None) -> int | None:
    if value is None:
        return current
    return value if current is None else min(current, value)


def tightest_renew_ms(rules: Iterable[CompiledRule]) -> int | None:
    """The shortest lease renew interval of the real (non-unlimited) budget rules."""
    out: int | None = None
    for rule in rules:
        if rule.unlimited or rule.kind != "budget":
            continue  # nothing to lease: never a candidate, not even a harmless one
        out = _min(out, rule.lease_renew_ms)
    return out


def effective_limits(rules: Iterable[CompiledRule], team: str,
                     user: str | None) -> EffectiveLimits:
    """Most-restrictive-wins limits for a caller (team name, optional user)."""
    applicable = [r for r in rules if r.applies_to(team, user)]
    acc: dict[str, int | None] = dict.fromkeys(
        ("rpm", "tpm", "budget_day_micro_usd", "budget_month_micro_usd",
         "tokens_per_day", "tokens_per_month", "max_in_flight"))
    unlimited: set[str] = set()
    for rule in applicable:
        if rule.unlimited:
            unlimited.add(rule.kind)
            continue
        if rule.kind == "rate":
            acc["rpm"] = _min(acc["rpm"], rule.rpm)
            acc["tpm"] = _min(acc["tpm"], rule.tpm)
        elif rule.kind == "concurrency":
            acc["max_in_flight"] = _min(acc["max_in_flight"], rule.max_in_flight)
        elif rule.kind == "tokenQuota":
            acc["tokens_per_day"] = _min(acc["tokens_per_day"], rule.tokens_per_day)
            acc["tokens_per_month"] = _min(acc["tokens_per_month"], rule.tokens_per_month)
        else:
            key = f"budget_{rule.window}_micro_usd"
            acc[key] = _min(acc[key], rule.limit_micro_usd)
    return EffectiveLimits(**acc, lease_renew_ms=tightest_renew_ms(applicable),
                           unlimited=tuple(sorted(unlimited)),
                           rules=tuple(sorted(r.uid for r in applicable)))
