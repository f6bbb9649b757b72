"""Planning: which counters a request charges (what settlements commit: test_settle)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import example, given
from hypothesis import strategies as st

from gateway.governance import (
    OutcomeKind,
    Settlement,
    build_request,
    plan_charges,
    settlement_fingerprint,
    utc_windows,
)
from gateway.keys import KeyLimits, Principal, Team, TeamLimits
from gateway.policy import EMPTY_SNAPSHOT, CompiledRule, PolicySnapshot

NOW = datetime(2026, 11, 29, 23, 30, tzinfo=UTC)


def principal(team: TeamLimits | None = None, key: KeyLimits | None = None,
              user: str | None = "alice") -> Principal:
    return Principal(key_id="k1", key_prefix="sk-inf-x", key_revision=3,
                     key_limits=key or KeyLimits(), allowed_models=None,
                     team=Team(id="t1", name="ml", limits=team or TeamLimits(), revision=4),
                     user=user)


def test_utc_windows_use_utc_not_local_time():
    """A local timestamp just after midnight east of UTC is still the previous UTC day."""
    local = datetime(2026, 12, 1, 1, 0, tzinfo=timezone(timedelta(hours=2)))
    assert utc_windows(local) == ("2026-11-30", "2026-11")


@given(st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9999, 12, 30),
                    timezones=st.sampled_from([UTC, timezone(timedelta(hours=-11)),
                                               timezone(timedelta(hours=13, minutes=45))])))
def test_utc_windows_are_the_utc_calendar_day_and_month(now: datetime):
    utc = now.astimezone(UTC)
    assert utc_windows(now) == (utc.strftime("%Y-%m-%d"), utc.strftime("%Y-%m"))


_parts = st.dictionaries(st.text(max_size=12), st.integers(0, 1 << 50), max_size=4)


@given(st.sampled_from(list(OutcomeKind)), st.integers(0, 1 << 50), st.integers(0, 1 << 50),
       st.booleans(), _parts, _parts)
# DEL: json.dumps escapes it (\u007f), msgspec does not (found by CI's run of this test)
@example(OutcomeKind.COMPLETE, 0, 0, False, {}, {"\x7f": 0})
@example(OutcomeKind.UNCERTAIN, 5, 7, True, {"team:a\x7fb:usd:day": 3}, {})
def test_settlement_fingerprint_is_the_one_earlier_releases_stored(
        kind: OutcomeKind, tokens: int, usd: int, exceeded: bool, commits: dict[str, int],
        liabilities: dict[str, int]):
    """Replays compare against fingerprints stored by earlier releases: the SHA-256 of
    json.dumps of the parts, compact, whatever the counter names hold (quotes,
    backslashes, control and non-ASCII characters)."""
    s = Settlement(kind=kind, tokens_committed=tokens, usd_committed=usd,
                   tokens_liability=usd // 3, usd_liability=tokens // 7,
                   bound_exceeded=exceeded, commits=commits, liabilities=liabilities)
    stored = json.dumps([str(s.kind), s.tokens_committed, s.usd_committed,
                         s.tokens_liability, s.usd_liability, s.bound_exceeded,
                         sorted(s.commits.items()), sorted(s.liabilities.items())],
                        separators=(",", ":"))
    assert settlement_fingerprint(s) == hashlib.sha256(stored.encode()).hexdigest()


def test_uncapped_principal_charges_nothing():
    """With no limit anywhere, a request reserves against no counter."""
    assert plan_charges(principal(), EMPTY_SNAPSHOT, token_bound=10, usd_bound=5,
                        now=NOW) == ()


def test_every_configured_limit_is_charged_once_in_lock_order():
    """Key and team limits each produce one charge, sorted by counter key, with the
    captured calendar window and the right amount per dimension."""
    charges = plan_charges(
        principal(TeamLimits(rpm=10, tpm=1000, tokens_per_day=5000, usd_micros_per_day=7,
                             usd_micros_per_month=70),
                  KeyLimits(rpm=2, tpm=100, usd_micros_per_day=3, usd_micros_per_month=30)),
        EMPTY_SNAPSHOT, token_bound=40, usd_bound=6, now=NOW)
    got = {c.counter: (c.kind, c.dimension, c.amount, c.limit, c.window) for c in charges}
    assert got == {
        "key:k1:rpm": ("bucket", "requests", 1, 2, None),
        "key:k1:tpm": ("bucket", "tokens", 40, 100, None),
        "key:k1:usd:day:2026-11-29": ("window", "usd", 6, 3, "2026-11-29"),
        "key:k1:usd:month:2026-11": ("window", "usd", 6, 30, "2026-11"),
        "team:t1:rpm": ("bucket", "requests", 1, 10, None),
        "team:t1:tpm": ("bucket", "tokens", 40, 1000, None),
        "team:t1:tokens:day:2026-11-29": ("window", "tokens", 40, 5000, "2026-11-29"),
        "team:t1:usd:day:2026-11-29": ("window", "usd", 6, 7, "2026-11-29"),
        "team:t1:usd:month:2026-11": ("window", "usd", 6, 70, "2026-11"),
    }
    assert [c.counter for c in charges] == sorted(got)


def test_policy_rules_charge_their_own_scoped_counters():
    """Rate, token-quota and budget rules each charge counters named by rule uid and
    scope; unlimited rules and rules for other teams charge nothing."""
    rules = (
        CompiledRule(uid="r-rate", policy="p", kind="rate", subject="team", team="ml",
                     tpm=500),
        CompiledRule(uid="r-quota", policy="p", kind="tokenQuota", subject="user",
                     user="*", tokens_per_month=9000),
        CompiledRule(uid="r-budget", policy="p", kind="budget", subject="team-user",
                     team="*", user="alice", limit_micro_usd=1000, window="month",
                     hard_cap=False),
        CompiledRule(uid="r-free", policy="p", kind="rate", subject="team", team="ml",
                     unlimited=True),
        CompiledRule(uid="r-other", policy="p", kind="rate", subject="team", team="ops",
                     rpm=1),
    )
    charges = plan_charges(principal(), PolicySnapshot(generation=2, rules=rules),
                           token_bound=40, usd_bound=6, now=NOW)
    got = {c.counter: (c.kind, c.amount, c.limit, c.rule_uid, c.hard) for c in charges}
    assert got == {
        "rule:r-rate:team=ml:tpm": ("bucket", 40, 500, "r-rate", True),
        "rule:r-quota:team=ml,user=alice:tokens:month:2026-11": ("window", 40, 9000,
                                                                 "r-quota", True),
        "account:r-budget:team=ml,user=alice:month:2026-11": ("account", 6, 1000,
                                                              "r-budget", False),
    }


def test_budget_fit_is_carried_by_the_windows_that_opted_in():
    """A team's budget_fit_floor marks its money and token windows; a budget rule's
    onShortfall: fit (compiled to fit_floor) marks its account; key windows never."""
    from gateway.policy import compile_documents

    [compiled] = compile_documents([{
        "apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
        "metadata": {"name": "p"}, "spec": {"rules": [{
            "name": "spend", "subject": {"kind": "team", "team": "ml"},
            "failurePolicy": "FailClosed",
            "budget": {"limitMilliUSD": 500, "window": "day", "onShortfall": "fit"}}]}}])
    assert compiled.fit_floor == 1024
    p = principal(TeamLimits(usd_micros_per_day=10**6, tokens_per_day=10**6,
                             budget_fit_floor=2048), KeyLimits(usd_micros_per_day=10**6))
    charges = plan_charges(p, PolicySnapshot(generation=1, rules=(compiled,)),
                           token_bound=40, usd_bound=6, now=NOW)
    fits = {c.counter: c.fit_floor for c in charges}
    assert fits == {"account:p/spend:team=ml:day:2026-11-29": 1024,
                    "key:k1:usd:day:2026-11-29": None,
                    "team:t1:tokens:day:2026-11-29": 2048,
                    "team:t1:usd:day:2026-11-29": 2048}


def test_build_request_captures_identity_revisions_and_generation():
    """The admission request carries the revisions and generation it was planned at."""
    req = build_request(principal(TeamLimits(rpm=1)), PolicySnapshot(generation=9),
                        request_id="r", model="m", token_bound=5, usd_bound=2, now=NOW)
    assert (req.key_revision, req.team_revision, req.policy_generation) == (3, 4, 9)
    assert (req.day, req.month, req.user) == ("2026-11-29", "2026-11", "alice")
