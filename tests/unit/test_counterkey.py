"""Counter keys: the strings are the stored ones, and parse reads back what was built."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gateway.governance import CounterKey, plan_charges
from gateway.keys import KeyLimits, Principal, Team, TeamLimits
from gateway.policy import CompiledRule, PolicySnapshot
from gateway.policy._wire import DNS_LABEL, DNS_SUBDOMAIN, UID_PATTERN

K = CounterKey.key("key_0123456789abcdef")
T = CounterKey.team("team_0123456789abcdef")
R = CounterKey.rule("platform/rate", "team=ml,user=al:ice")


@pytest.mark.parametrize(("key", "text"), [
    (K.bucket("rpm"), "key:key_0123456789abcdef:rpm"),
    (K.bucket("tpm"), "key:key_0123456789abcdef:tpm"),
    (K.windowed("usd", "day", "2026-12-04"), "key:key_0123456789abcdef:usd:day:2026-12-04"),
    (K.windowed("usd", "month", "2026-12"), "key:key_0123456789abcdef:usd:month:2026-12"),
    (T.bucket("rpm"), "team:team_0123456789abcdef:rpm"),
    (T.windowed("tokens", "day", "2026-12-04"),
     "team:team_0123456789abcdef:tokens:day:2026-12-04"),
    (T.windowed("usd", "month", "2026-12"), "team:team_0123456789abcdef:usd:month:2026-12"),
    (R.bucket("tpm"), "rule:platform/rate:team=ml,user=al:ice:tpm"),
    (R.windowed("tokens", "month", "2026-12"),
     "rule:platform/rate:team=ml,user=al:ice:tokens:month:2026-12"),
    (CounterKey.account("p/spend", "team=ml", "day", "2026-12-04"),
     "account:p/spend:team=ml:day:2026-12-04"),
    (K, "key:key_0123456789abcdef"),
    (T, "team:team_0123456789abcdef"),
    (CounterKey.policy(), "policy"),
])
def test_keys_are_the_stored_strings(key: CounterKey, text: str) -> None:
    """Byte for byte the format stored in the databases and journals."""
    assert key.text == str(key) == text
    assert CounterKey.parse(text) == key


@pytest.mark.parametrize("text", [
    "", "policy:x", "key", "key:", "key::rpm", "key:k:", "key:k:rph", "key:k:usd:day",
    "key:k:usd:week:2026-12", "key:k:usd:day:2026-12", "key:k:usd:month:2026-12-04",
    "key:k:usd:day:2026-12-04\n", "key:k:eur:day:2026-12-04", "key:k:a:usd:day:2026-12-04",
    "team:t:usd:day:２０２６-12-04", "rule:r:rpm", "rule:r::rpm", "rule:r:team=a",
    "rule:r:team=a:usd:day:2026-12-04", "rule::team=a:rpm", "account:p", "account:p:day:2026-12-04",
    "account:p::day:2026-12-04", "account:p:team=a:week:2026-12", "account:p:team=a:day:2026-12",
    "other:x:rpm",
])
def test_what_is_not_a_counter_key_parses_to_none(text: str) -> None:
    assert CounterKey.parse(text) is None


# Key and team ids are generated (key_<hex>, team_<hex>) or copied by the import; any
# text without ":" stands for them. Rule uids are an explicit uid or <policy>/<rule>.
_ids = st.text(st.characters(blacklist_characters=":"), min_size=1, max_size=24)
_uids = st.one_of(
    st.from_regex(UID_PATTERN, fullmatch=True).filter(lambda u: len(u) <= 128),
    st.builds(lambda p, r: f"{p}/{r}", st.from_regex(DNS_SUBDOMAIN, fullmatch=True),
              st.from_regex(DNS_LABEL, fullmatch=True)))
# Team names and users may hold anything non-empty: ":", "=", ",", newlines, non-ASCII.
_names = st.text(min_size=1, max_size=24)
_scopes = st.one_of(st.builds(lambda t: f"team={t}", _names),
                    st.builds(lambda u: f"user={u}", _names),
                    st.builds(lambda t, u: f"team={t},user={u}", _names, _names))
_dates = st.dates(min_value=date(1000, 1, 1), max_value=date(9999, 12, 31))


@st.composite
def _windowed(draw: st.DrawFn) -> tuple[str, str]:
    day = draw(_dates)
    return draw(st.sampled_from([("day", day.isoformat()), ("month", day.isoformat()[:7])]))


@st.composite
def counter_keys(draw: st.DrawFn) -> CounterKey:
    """Every kind of key the planner, the refusals and the lease protocol build."""
    subject = draw(st.sampled_from(["key", "team", "rule", "account", "policy"]))
    if subject == "policy":
        return CounterKey.policy()
    window, period = draw(_windowed())
    assert window == "day" or window == "month"
    if subject == "account":
        return CounterKey.account(draw(_uids), draw(_scopes), window, period)
    if subject == "rule":
        rule = CounterKey.rule(draw(_uids), draw(_scopes))
        return draw(st.sampled_from([rule.bucket("rpm"), rule.bucket("tpm"),
                                     rule.windowed("tokens", window, period)]))
    own = CounterKey.key(draw(_ids)) if subject == "key" else CounterKey.team(draw(_ids))
    return draw(st.sampled_from([own, own.bucket("rpm"), own.bucket("tpm"),
                                 own.windowed("tokens", window, period),
                                 own.windowed("usd", window, period)]))


@given(counter_keys())
@example(CounterKey.account("p/spend", "team=a:day:2026-12-04", "month", "2026-12"))
@example(CounterKey.rule("r", "user=x:tokens:day:2026-12-04:rpm").bucket("tpm"))
@example(CounterKey.rule("r", "team=a\n:rpm").windowed("tokens", "day", "2026-12-04"))
@example(CounterKey.team("t\n").windowed("usd", "day", "2026-12-04"))
def test_parse_reads_back_every_key_built(key: CounterKey) -> None:
    assert CounterKey.parse(key.text) == key


@given(st.one_of(st.text(max_size=60), counter_keys().map(lambda k: k.text + "x"),
                 counter_keys().map(lambda k: "x" + k.text)))
def test_only_canonical_strings_parse(text: str) -> None:
    """What parses is exactly what building its parts writes (no second spelling)."""
    key = CounterKey.parse(text)
    assert key is None or key.text == text


def test_owner_is_whose_limit_it_is() -> None:
    assert [k.owner for k in (K, K.bucket("rpm"), T.windowed("usd", "day", "2026-12-04"),
                              R.bucket("rpm"), CounterKey.account("p", "user=u", "month",
                                                                  "2026-12"),
                              CounterKey.policy())] == [
        "key", "key", "team", "policy", "policy", "policy"]


def test_every_planned_counter_parses_to_its_charge() -> None:
    """The planner's keys read back with the charge's window as their period."""
    principal = Principal(
        key_id="key_1", key_prefix="sk", key_revision=1, allowed_models=None,
        key_limits=KeyLimits(rpm=1, tpm=2, usd_micros_per_day=3, usd_micros_per_month=4),
        team=Team(id="team_1", name="m:l", revision=1, limits=TeamLimits(
            rpm=1, tpm=2, tokens_per_day=3, usd_micros_per_day=4, usd_micros_per_month=5)),
        user="al:ice")
    rules = (
        CompiledRule(uid="p/rate", policy="p", kind="rate", subject="team", team="*",
                     rpm=5, tpm=6),
        CompiledRule(uid="p/quota", policy="p", kind="tokenQuota", subject="user",
                     user="*", tokens_per_day=7, tokens_per_month=8),
        CompiledRule(uid="p/spend", policy="p", kind="budget", subject="team-user",
                     team="*", user="*", limit_micro_usd=9, window="day"),
    )
    charges = plan_charges(principal, PolicySnapshot(generation=1, rules=rules),
                           token_bound=10, usd_bound=11,
                           now=datetime(2026, 12, 4, 23, 59, tzinfo=UTC))
    assert len(charges) == 14
    for c in charges:
        key = CounterKey.parse(c.counter)
        assert key is not None, c.counter
        assert key.period == (c.window or ""), c.counter
        assert (key.measure in ("rpm", "tpm")) == (c.kind == "bucket"), c.counter
        assert (key.subject == "account") == (c.kind == "account"), c.counter
        assert key.id in ("key_1", "team_1", c.rule_uid), c.counter
