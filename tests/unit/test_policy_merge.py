"""Most-restrictive-wins merge, including regressions for ADR-039's two merge bugs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.policy import CompiledRule, effective_limits, tightest_renew_ms


def budget(uid: str, limit: int | None, *, renew_ms: int | None = None,
           unlimited: bool = False, window: str = "month") -> CompiledRule:
    return CompiledRule(uid=uid, policy=uid, kind="budget", subject="team", team="t",
                        unlimited=unlimited, limit_micro_usd=limit, window=window,  # type: ignore[arg-type]
                        hard_cap=not unlimited, lease_renew_ms=renew_ms,
                        lease_grant_micro_usd=None if renew_ms is None else 1)


def rate(uid: str, rpm: int | None, tpm: int | None, *, unlimited: bool = False,
         team: str = "t") -> CompiledRule:
    return CompiledRule(uid=uid, policy=uid, kind="rate", subject="team", team=team,
                        unlimited=unlimited, rpm=rpm, tpm=tpm)


def test_unlimited_after_a_real_budget_does_not_erase_it() -> None:
    """ADR-039 bug 1: an unlimited budget processed after a real one keeps the real cap."""
    merged = effective_limits([budget("real", 5_000_000), budget("free", None,
                                                                  unlimited=True)], "t", None)
    assert merged.budget_month_micro_usd == 5_000_000
    assert merged.unlimited == ("budget",)


def test_unlimited_does_not_discard_a_real_lease_renew_interval() -> None:
    """ADR-039 bug 2: an unlimited rule never replaces the tightest real renewInterval."""
    rules = [budget("real", 5_000_000, renew_ms=10_000),
             budget("free", None, unlimited=True)]
    assert tightest_renew_ms(rules) == 10_000
    assert tightest_renew_ms(list(reversed(rules))) == 10_000
    assert effective_limits(rules, "t", None).lease_renew_ms == 10_000


def test_rules_of_other_teams_do_not_apply() -> None:
    """Only rules whose subject matches the caller take part in the merge."""
    merged = effective_limits([rate("mine", 10, None), rate("theirs", 1, None, team="u"),
                               rate("all", None, 500, team="*")], "t", None)
    assert (merged.rpm, merged.tpm) == (10, 500)
    assert merged.rules == ("all", "mine")


real_budgets = st.builds(
    lambda i, limit, renew, window: budget(f"b{i}", limit, renew_ms=renew, window=window),
    st.integers(0, 1000), st.integers(1, 10**12), st.one_of(st.none(), st.integers(1000, 10**6)),
    st.sampled_from(["day", "month"]))
real_rates = st.builds(lambda i, rpm, tpm: rate(f"r{i}", rpm, tpm), st.integers(0, 1000),
                       st.one_of(st.none(), st.integers(1, 10**6)),
                       st.one_of(st.none(), st.integers(1, 10**9)))
unlimited_rules = st.one_of(
    st.builds(lambda i: budget(f"ub{i}", None, unlimited=True), st.integers(0, 1000)),
    st.builds(lambda i: rate(f"ur{i}", None, None, unlimited=True), st.integers(0, 1000)))


def _min(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


@given(st.lists(real_budgets, max_size=6), st.lists(real_rates, max_size=6),
       st.lists(unlimited_rules, max_size=6), st.randoms(use_true_random=False))
def test_merge_is_min_of_real_caps_in_every_order(budgets: list[CompiledRule],
                                                  rates: list[CompiledRule],
                                                  unlimited: list[CompiledRule],
                                                  rnd: object) -> None:
    """In any document order, effective caps are the min of real caps; unlimited adds none."""
    rules = budgets + rates + unlimited
    rnd.shuffle(rules)  # type: ignore[attr-defined]
    merged = effective_limits(rules, "t", None)
    assert merged.rpm == _min([r.rpm for r in rates])
    assert merged.tpm == _min([r.tpm for r in rates])
    for window in ("day", "month"):
        expected = _min([b.limit_micro_usd for b in budgets if b.window == window])
        assert getattr(merged, f"budget_{window}_micro_usd") == expected
    assert merged.lease_renew_ms == _min([b.lease_renew_ms for b in budgets])
    assert merged == effective_limits(list(reversed(rules)), "t", None)
