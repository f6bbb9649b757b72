"""Retry semantics clients obey, in both shapes: what a refusal tells an SDK (retry or not,
when), each refusal code's own machine-readable code, and no internals in a 5xx message."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import msgspec
import pytest

from gateway.errors import GovernanceUnavailable, UpstreamUnavailable
from gateway.governance import Bounds, LeaseFacts, Refusal, RefusalFigures, refusal
from gateway.governance._refusal import _STATUS
from gateway.ingress._ratelimit import window_headers
from gateway.ingress._render import error_reply
from gateway.ingress._shortfall import refusal_error
from gateway.pricing import ModelPrice

NOW = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)  # 20 h before the day window resets
# µUSD bound 1000 + 4 × max_tokens: 998 for the input, 4 per output token, 2 of rounding.
BOUNDS = Bounds(input_tokens=100, output_tokens=1000, input_classes=frozenset(("input",)),
                price=ModelPrice(input=9_980_000, output=4_000_000))
assert [BOUNDS.usd_of(n) for n in (0, 1, 1000)] == [1000, 1004, 5000]
DAY_TOKENS = RefusalFigures(limit=500, committed=450, amount=1100, window="2026-12-01",
                            dimension="tokens")
DAY_USD = RefusalFigures(limit=2000, committed=1500, amount=5000, window="2026-12-01")


def _refusals() -> dict[str, Refusal]:
    """One refusal of every code a store or the lease state reports."""
    rate = RefusalFigures(limit=60, amount=1, dimension="requests")
    return {
        "rate_limited": refusal("rate_limited", "team:t:rpm", figures=rate, retry_after=7),
        "token_quota_exhausted": refusal("token_quota_exhausted", "team:t:tokens:day",
                                         figures=DAY_TOKENS),
        "budget_exhausted": refusal("budget_exhausted", "team:t:usd:day", figures=DAY_USD),
        "concurrency_limited": refusal("concurrency_limited", "rule:p/r:key=key_1:inflight",
                                       figures=RefusalFigures(limit=4, reserved=4, amount=1,
                                                              dimension="requests")),
        "account_frozen": refusal("account_frozen", "team:t:usd:day", frozen_by="p1"),
        "snapshot_mismatch": refusal("snapshot_mismatch", "policy", retry_after=1),
        "lease_missing": refusal("lease_missing", "acct", retry_after=1,
                                 lease=LeaseFacts(started=True)),
        "lease_expired": refusal("lease_expired", "acct", retry_after=5,
                                 lease=LeaseFacts(renewals=3)),
        "lease_exhausted": refusal("lease_exhausted", "acct", retry_after=1,
                                   lease=LeaseFacts(allowance=10, remaining=99)),
        "rule_unsupported": refusal("rule_unsupported", "acct", retry_after=60,
                                    lease=LeaseFacts(gate="rule p/r cannot be enforced")),
    }


def _answer(decision: Refusal, *, anthropic: bool) -> tuple[int, dict[str, str], dict[str, object]]:
    err = refusal_error(decision, BOUNDS, now=NOW)
    reply = error_reply(None, err, anthropic=anthropic, path="/v1/x", route="/v1/x",
                        request_id="req_1", principal=None, call=None)
    body: dict[str, object] = msgspec.json.decode(reply.body)
    return reply.status, reply.headers, body


def _codes(body: dict[str, object]) -> tuple[object, object]:
    """(type, machine code) of an error body in either shape."""
    error = body["error"]
    assert isinstance(error, dict)
    if body.get("type") == "error":
        return error["type"], error["details"]["error_code"]
    return error["type"], error["code"]


def test_every_refusal_code_keeps_its_status() -> None:
    """Each code the stores report maps to an error of the status governance decided."""
    assert set(_refusals()) == set(_STATUS)
    for code, decision in _refusals().items():
        assert refusal_error(decision, BOUNDS, now=NOW).status == decision.status, code


@pytest.mark.parametrize("code", ["token_quota_exhausted", "budget_exhausted",
                                  "account_frozen", "rule_unsupported"])
@pytest.mark.parametrize("anthropic", [False, True])
def test_refusals_that_cannot_clear_soon_say_do_not_retry(code: str, anthropic: bool) -> None:
    """A spent window, a frozen account or an unenforceable rule: x-should-retry false
    and no Retry-After (an SDK would sleep on it for hours)."""
    _, headers, _ = _answer(_refusals()[code], anthropic=anthropic)
    assert headers["x-should-retry"] == "false"
    assert "Retry-After" not in headers


@pytest.mark.parametrize(("code", "wait"), [
    ("rate_limited", "7"), ("concurrency_limited", "1"), ("snapshot_mismatch", "1"),
    ("lease_missing", "1"),
    ("lease_expired", "5"), ("lease_exhausted", "1")])
def test_refusals_that_clear_soon_keep_their_precise_retry_after(code: str, wait: str) -> None:
    """Buckets, snapshots and lease renewals: x-should-retry true, Retry-After as given."""
    for anthropic in (False, True):
        _, headers, _ = _answer(_refusals()[code], anthropic=anthropic)
        assert headers["x-should-retry"] == "true" and headers["Retry-After"] == wait


def test_a_spent_window_says_when_it_resets_in_body_and_headers() -> None:
    """The reset of a spent day window stays in the message and the remaining-limit
    headers of both protocols (a token quota's remaining tokens too)."""
    _, oh, ob = _answer(_refusals()["token_quota_exhausted"], anthropic=False)
    _, ah, ab = _answer(_refusals()["token_quota_exhausted"], anthropic=True)
    assert "resets at 2026-12-02T00:00:00+00:00" in str(ob) and "resets at" in str(ab)
    assert oh["x-inferplane-window-reset"] == ah["x-inferplane-window-reset"] == \
        "2026-12-02T00:00:00Z"
    assert oh["x-ratelimit-remaining-tokens"] == ah["anthropic-ratelimit-tokens-remaining"] \
        == "50"
    assert oh["x-ratelimit-limit-tokens"] == "500"
    assert ah["anthropic-ratelimit-tokens-reset"] == "2026-12-02T00:00:00Z"
    window = refusal_error(_refusals()["token_quota_exhausted"], BOUNDS, now=NOW).window
    assert window is not None
    assert window_headers(window, anthropic=False, now=NOW)["x-ratelimit-reset-tokens"] == \
        "20h0m1s"
    _, mh, _ = _answer(_refusals()["budget_exhausted"], anthropic=False)
    assert mh["x-inferplane-window-reset"] == "2026-12-02T00:00:00Z"
    assert not any(h.startswith("x-ratelimit") for h in mh)  # no protocol money headers


@pytest.mark.parametrize(("code", "openai", "anthropic"), [
    ("rate_limited", ("rate_limit_error", "rate_limit_exceeded"),
     ("rate_limit_error", "rate_limited")),
    ("token_quota_exhausted", ("insufficient_quota", "insufficient_quota"),
     ("rate_limit_error", "token_quota_exhausted")),
    ("concurrency_limited", ("rate_limit_error", "concurrency_limited"),
     ("rate_limit_error", "concurrency_limited")),
    ("budget_exhausted", ("insufficient_quota", "insufficient_quota"),
     ("billing_error", "budget_exhausted")),
    ("account_frozen", ("insufficient_quota", "insufficient_quota"),
     ("billing_error", "account_frozen")),
    ("snapshot_mismatch", ("server_error", "snapshot_mismatch"),
     ("overloaded_error", "snapshot_mismatch")),
    ("lease_missing", ("server_error", "lease_missing"), ("overloaded_error", "lease_missing")),
    ("lease_expired", ("server_error", "lease_expired"), ("overloaded_error", "lease_expired")),
    ("lease_exhausted", ("server_error", "lease_exhausted"),
     ("overloaded_error", "lease_exhausted")),
    ("rule_unsupported", ("server_error", "rule_unsupported"),
     ("api_error", "rule_unsupported")),
])
def test_each_refusal_code_has_its_machine_readable_code_in_both_shapes(
        code: str, openai: tuple[str, str], anthropic: tuple[str, str]) -> None:
    """OpenAI's error type/code and Anthropic's type/details.error_code, per refusal code."""
    assert _codes(_answer(_refusals()[code], anthropic=False)[2]) == openai
    assert _codes(_answer(_refusals()[code], anthropic=True)[2]) == anthropic


def test_a_money_rate_bucket_refusal_is_402_and_retried() -> None:
    """A µUSD-per-minute bucket refuses 402 but refills: x-should-retry true, its wait."""
    figures = RefusalFigures(limit=1000, amount=5000, dimension="usd")
    status, headers, body = _answer(
        refusal("rate_limited", "team:t:usd-rate", figures=figures, retry_after=12),
        anthropic=False)
    assert status == 402 and headers["x-should-retry"] == "true"
    assert headers["Retry-After"] == "12" and _codes(body)[1] == "rate_limit_exceeded"


@pytest.mark.parametrize("anthropic", [False, True])
def test_an_upstream_failure_names_no_provider_or_exception(
        anthropic: bool, caplog: pytest.LogCaptureFixture) -> None:
    """A 5xx built from a transport error shows the kind's sentence and the request id;
    the provider and exception text go to the log only."""
    try:
        try:
            raise ConnectionResetError("peer reset")
        except ConnectionResetError as exc:
            raise UpstreamUnavailable(
                "upstream an-cut failed: an-cut: ConnectionResetError: peer reset") from exc
    except UpstreamUnavailable as err:
        with caplog.at_level(logging.WARNING, logger="mayu.ingress"):
            reply = error_reply(None, err, anthropic=anthropic, path="/v1/x", route="/v1/x",
                                request_id="req_abc", principal=None, call=None)
    text = reply.body.decode()
    assert reply.status == 502
    for internal in ("an-cut", "ConnectionResetError", "peer reset"):
        assert internal not in text
    assert "The upstream provider could not be reached (request req_abc)." in text
    assert "req_abc" in caplog.text and "an-cut: ConnectionResetError: peer reset" in caplog.text


def test_a_database_error_text_never_reaches_the_client() -> None:
    """A store failure translated from a driver error (raise … from exc) answers 503 with
    the kind's own sentence, still retryable."""
    try:
        try:
            raise OSError("connection to server at 10.0.0.5 port 5432 failed")
        except OSError as exc:
            raise GovernanceUnavailable(f"governance: database unavailable ({exc})") from exc
    except GovernanceUnavailable as err:
        reply = error_reply(None, err, anthropic=False, path="/v1/x", route="/v1/x",
                            request_id="req_db", principal=None, call=None)
    assert reply.status == 503 and reply.headers["x-should-retry"] == "true"
    assert b"10.0.0.5" not in reply.body and b"database unavailable" not in reply.body
    assert b"Governance storage is unavailable; no request is admitted (request req_db)." \
        in reply.body


def test_a_refusal_keeps_its_wording() -> None:
    """Refusals (not raised from another error) keep their full message for the client."""
    _, _, body = _answer(_refusals()["lease_expired"], anthropic=False)
    assert "expired" in str(body) and "3 renew intervals" in str(body)


def test_a_refusal_of_n_choices_advises_a_per_choice_max_tokens() -> None:
    """A chat request with n=4 choices and max_tokens 250 may generate 1,000 tokens: the
    refusal names its limit per choice and advises a per-choice max_tokens that fits
    (the one budget fit would write), never the total."""
    figures = RefusalFigures(limit=5000, committed=2000, amount=5000, window="2026-12-01")
    decision = refusal("budget_exhausted", "team:t:usd:day", figures=figures)
    one = refusal_error(decision, BOUNDS, now=NOW).message
    four = refusal_error(decision, msgspec.structs.replace(BOUNDS, choices=4), now=NOW).message
    # 3,000 µUSD left fits 1000 + 4 × 500 output tokens: 500 in all, 125 per choice.
    assert "max_tokens 1000." in one and "max_tokens <= 500 would fit now" in one
    assert "max_tokens 250 per choice × n=4." in four
    assert "max_tokens <= 125 per choice × n=4 would fit now" in four
