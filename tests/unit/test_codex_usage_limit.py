"""A spent window is sent to Codex CLI in the one shape it stops on (issue 26)."""

from __future__ import annotations

from datetime import UTC, datetime

from gateway.errors import BudgetExhausted, RateLimited, SpentWindow, openai_error_body
from gateway.ingress._render import codex_usage_limit

RESET = datetime(2026, 12, 5, tzinfo=UTC)


def _spent() -> BudgetExhausted:
    err = BudgetExhausted("team budget spent: the 2026-12-04 window resets at midnight")
    err.window = SpentWindow(dimension="usd", limit=1_000_000, remaining=0, resets=RESET)
    return err


def test_codex_gets_a_429_usage_limit_reached_with_the_reset() -> None:
    for agent in ("codex_exec/0.171.0 (Debian 12; x86_64) dumb",
                  "codex_cli_rs/0.171.0 (Mac OS 15.1; arm64) iTerm.app"):
        err = _spent()
        body = openai_error_body(err)
        assert codex_usage_limit(err, agent, body) == 429
        assert body["error"]["type"] == "usage_limit_reached"
        assert body["error"]["resets_at"] == int(RESET.timestamp())
        assert body["error"]["code"] == "insufficient_quota"
        assert "resets at midnight" in body["error"]["message"]


def test_every_other_client_and_refusal_is_unchanged() -> None:
    for agent in (None, "", "OpenAI/Python 2.8.1", "curl/8.5", "xcodex_exec/1"):
        err = _spent()
        body = openai_error_body(err)
        before = {**body["error"]}
        assert codex_usage_limit(err, agent, body) is None
        assert body["error"] == before
    rate = RateLimited("rpm", retry_after=3)  # clears soon: Codex's own retry is right
    body = openai_error_body(rate)
    assert codex_usage_limit(rate, "codex_exec/0.171.0", body) is None
