"""Settlement figures: committed ≤ truth ≤ committed + liability, exact when observed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.governance import AdmissionRequest, Outcome, OutcomeKind, build_request, settlement_for
from gateway.keys import KeyLimits, Principal, Team, TeamLimits
from gateway.policy import EMPTY_SNAPSHOT
from gateway.pricing import ModelPrice, Usage, cost_bound_micro_usd, cost_micro_usd

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
PRICE = ModelPrice(input=3_000_000, output=15_000_000, cache_read=300_000,
                   cache_write_5m=3_750_000, cache_write_1h=6_000_000)
TEAM = TeamLimits(rpm=5, tpm=100_000, tokens_per_day=10**9, usd_micros_per_day=10**9)


def request(input_bound: int = 5000, output_bound: int = 1000) -> AdmissionRequest:
    p = Principal(key_id="k1", key_prefix="sk-inf-x", key_revision=1, key_limits=KeyLimits(),
                  allowed_models=None, team=Team(id="t1", name="ml", limits=TEAM, revision=1),
                  user=None)
    return build_request(p, EMPTY_SNAPSHOT, request_id="r", model="m",
                         token_bound=input_bound + output_bound,
                         usd_bound=cost_bound_micro_usd(input_bound, output_bound, PRICE),
                         now=NOW)


REQ = request()
USD, TOKENS = "team:t1:usd:day:2026-12-01", "team:t1:tokens:day:2026-12-01"


def test_complete_commits_the_exact_cost_and_no_liability():
    """Every class reported: committed is the exact priced usage, nothing else binds."""
    usage = Usage(input=1000, output=200, cache_read=3000, cache_write_5m=100)
    s = settlement_for(REQ, Outcome(kind=OutcomeKind.COMPLETE, usage=usage), PRICE)
    assert s.kind is OutcomeKind.COMPLETE
    assert (s.usd_committed, s.usd_liability) == (cost_micro_usd(usage, PRICE), 0)
    assert s.commits[USD] == s.usd_committed and USD not in s.liabilities
    assert s.commits["team:t1:tpm"] == usage.total_tokens() == s.commits[TOKENS]
    assert s.commits["team:t1:rpm"] == 1


def test_unknown_ttl_commits_the_cheaper_class_and_the_difference_is_liability():
    """tokens_known: tokens exact, money at 5m, the 1h difference kept as liability."""
    usage = Usage(input=10, output=5, cache_write_unknown=1000)
    s = settlement_for(REQ, Outcome(kind=OutcomeKind.COMPLETE, usage=usage), PRICE)
    low = cost_micro_usd(Usage(input=10, output=5, cache_write_5m=1000), PRICE)
    high = cost_micro_usd(Usage(input=10, output=5, cache_write_1h=1000), PRICE)
    assert s.kind is OutcomeKind.TOKENS_KNOWN
    assert (s.tokens_committed, s.tokens_liability) == (1015, 0)
    assert (s.usd_committed, s.usd_liability) == (low, high - low)
    assert s.liabilities == {USD: high - low}


def test_cut_stream_commits_what_arrived_and_the_rest_of_the_bound_is_liability():
    """uncertain: observed input classes and content commit; bound − committed binds."""
    seen = Usage(input=1200, output=1, cache_read=500)
    s = settlement_for(REQ, Outcome(kind=OutcomeKind.UNCERTAIN, usage=seen, output_floor=3),
                       PRICE)
    observed = Usage(input=1200, output=3, cache_read=500)
    assert s.usd_committed == cost_micro_usd(observed, PRICE)
    assert s.usd_committed + s.usd_liability == REQ.usd_bound
    assert s.tokens_committed + s.tokens_liability == REQ.token_bound
    # TPM keeps its reservation (never refunded while uncertain), debits what was seen.
    assert s.commits["team:t1:tpm"] == max(REQ.token_bound, s.tokens_committed)


def test_nothing_left_the_gateway_commits_nothing_and_counts_no_request():
    """cancelled: full refund, requests-per-minute included."""
    s = settlement_for(REQ, Outcome(kind=OutcomeKind.CANCELLED))
    assert set(s.commits.values()) == {0} and not s.liabilities


def test_usage_above_the_bound_is_committed_in_full_and_flagged():
    """Valid usage the provider will invoice is committed, marked bound_exceeded."""
    usage = Usage(input=REQ.token_bound * 2, output=2000)
    s = settlement_for(REQ, Outcome(kind=OutcomeKind.COMPLETE, usage=usage), PRICE)
    assert s.bound_exceeded and s.usd_committed == cost_micro_usd(usage, PRICE)
    assert s.commits[USD] == s.usd_committed > REQ.usd_bound


def test_invalid_commits_nothing():
    """invalid: no part at all (the store freezes the money counters instead)."""
    s = settlement_for(REQ, Outcome(kind=OutcomeKind.INVALID, detail="negative"))
    assert (s.commits, s.liabilities, s.usd_committed) == ({}, {}, 0)


counts = st.integers(min_value=0, max_value=4000)


@given(inp=counts, out=st.integers(min_value=0, max_value=1000), read=counts,
       w5=counts, w1=counts, unknown=counts, cut=st.floats(min_value=0, max_value=1))
def test_committed_never_above_truth_and_truth_never_above_committed_plus_liability(
        inp, out, read, w5, w1, unknown, cut):
    """For any true usage within the bound and any cut point of its stream, the three
    figures bracket the truth; equality when the usage was reported in full."""
    total_in = inp + read + w5 + w1 + unknown
    req = request(input_bound=max(total_in, 1), output_bound=max(out, 1))
    true_cost_5m = cost_micro_usd(Usage(input=inp, output=out, cache_read=read,
                                        cache_write_5m=w5 + unknown, cache_write_1h=w1), PRICE)
    true_cost_1h = cost_micro_usd(Usage(input=inp, output=out, cache_read=read,
                                        cache_write_5m=w5, cache_write_1h=w1 + unknown), PRICE)
    reported = Usage(input=inp, output=out, cache_read=read, cache_write_5m=w5,
                     cache_write_1h=w1, cache_write_unknown=unknown)
    full = settlement_for(req, Outcome(kind=OutcomeKind.COMPLETE, usage=reported), PRICE)
    for true_cost in (true_cost_5m, true_cost_1h):
        assert full.usd_committed <= true_cost <= full.usd_committed + full.usd_liability
    if not unknown:
        assert full.usd_liability == 0 and full.usd_committed == true_cost_5m
    # A cut after the input classes arrived and some content was relayed.
    floor = int(out * cut)
    partial = Usage(input=inp, output=min(1, out), cache_read=read, cache_write_5m=w5,
                    cache_write_1h=w1, cache_write_unknown=unknown)
    s = settlement_for(req, Outcome(kind=OutcomeKind.UNCERTAIN, usage=partial,
                                    output_floor=floor), PRICE)
    for true_cost in (true_cost_5m, true_cost_1h):
        assert s.usd_committed <= true_cost <= s.usd_committed + s.usd_liability
    assert s.tokens_committed <= reported.total_tokens() <= s.tokens_committed + \
        s.tokens_liability


@pytest.mark.parametrize("kind", [OutcomeKind.UNCERTAIN, OutcomeKind.CANCELLED])
def test_no_usage_needs_no_price(kind):
    """Recovery settles from the journal alone: no usage, no price needed."""
    s = settlement_for(REQ, Outcome(kind=kind))
    assert s.usd_committed == 0


def test_tpm_is_charged_the_estimate_and_trued_up_to_the_actual_total():
    """ADR-039: TPM reserves body/4, settlement commits every class's actual total (an
    under-estimate debits into debt); quotas and money keep the sound bounds."""
    from gateway.governance import tpm_estimate

    p = Principal(key_id="k1", key_prefix="sk-inf-x", key_revision=1, key_limits=KeyLimits(),
                  allowed_models=None, team=Team(id="t1", name="ml", limits=TEAM, revision=1),
                  user=None)
    estimate = tpm_estimate(108_000)
    req = build_request(p, EMPTY_SNAPSHOT, request_id="r", model="m", token_bound=140_000,
                        usd_bound=10**6, now=NOW, tpm=estimate)
    charged = {c.counter: c.amount for c in req.charges}
    assert charged["team:t1:tpm"] == estimate == 27_000
    assert charged[TOKENS] == 140_000
    usage = Usage(input=2_000, cache_read=25_000, output=900)
    s = settlement_for(req, Outcome(kind=OutcomeKind.COMPLETE, usage=usage), PRICE)
    assert s.commits["team:t1:tpm"] == 27_900  # > the estimate: 900 tokens of debt
    cut = settlement_for(req, Outcome(kind=OutcomeKind.UNCERTAIN), PRICE)
    assert cut.commits["team:t1:tpm"] == estimate


usages = st.builds(Usage, input=counts, output=counts, cache_read=counts,
                   cache_write_5m=counts, cache_write_1h=counts, cache_write_unknown=counts)


@given(kind=st.sampled_from(list(OutcomeKind)), usage=st.none() | usages,
       floor=st.integers(min_value=0, max_value=6000))
def test_the_recorded_classes_add_up_to_the_committed_tokens(kind, usage, floor):
    """Whatever the outcome (a cut stream's output floor included), the per-class usage a
    settlement records — the audit line's and the request log's — sums to its committed
    tokens (issue 33: 4,221 shown of 4,229 committed)."""
    s = settlement_for(REQ, Outcome(kind=kind, usage=usage, output_floor=floor), PRICE)
    shown = 0 if s.usage is None else s.usage.total_tokens()
    assert shown == s.tokens_committed
    for c in REQ.charges:
        if c.dimension == "tokens" and c.kind != "bucket" and kind is not OutcomeKind.INVALID:
            assert s.commits[c.counter] == shown
