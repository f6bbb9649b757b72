"""What a money refusal tells a client (issue 33): a request's own bound is a request
error, never a spent limit; the input bound's true basis; what one more turn needs; what
liability is and when it ends."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from gateway.catalog import builtin_catalog
from gateway.config import Deployment, ModelSettings
from gateway.governance import Bounds, RefusalFigures, refusal
from gateway.ingress._render import error_reply
from gateway.ingress._shortfall import (
    input_words,
    largest_output,
    liability_words,
    refusal_error,
)

NOW = datetime(2026, 12, 7, 4, 0, tzinfo=UTC)
COUNTER = "team:team_x:usd:day:2026-12-07"
CODEX = "codex_exec/0.171.0 (Debian 12; x86_64) xterm-256color"


def _price(model: str) -> Any:
    entry = builtin_catalog().get(model)
    assert entry is not None
    return entry.price


def _codex_bounds(input_tokens: int = 1083) -> Bounds:
    """A Codex turn on gpt-6.2-sol that names no output limit: the 128k ceiling."""
    return Bounds(input_tokens=input_tokens, output_tokens=128_000,
                  price=_price("gpt-6.2-sol"),
                  input_classes=frozenset(("input", "cache_read")))


def _refused(bounds: Bounds, *, limit: int, committed: int = 0, liability: int = 0) -> Any:
    figures = RefusalFigures(limit=limit, committed=committed, liability=liability,
                             amount=bounds.usd, window="2026-12-07")
    return refusal("budget_exhausted", COUNTER, figures=figures)


def _rendered(err: Exception, user_agent: str) -> tuple[int, dict[str, Any]]:
    reply = error_reply(None, err, anthropic=False, path="/v1/responses", route="responses",
                        request_id="req_1", principal=None, call=None, user_agent=user_agent)
    return reply.status, msgspec.json.decode(reply.body)


def test_a_request_whose_own_bound_passes_the_limit_is_a_request_error() -> None:
    """Codex on a $1/day team that spent nothing, no output limit named (the 128k
    ceiling): a 400 invalid_request naming max_output_tokens and what fits, no spent
    window, so Codex never shows "You've hit your usage limit"."""
    bounds = _codex_bounds()
    err = refusal_error(_refused(bounds, limit=1_000_000), bounds, endpoint="responses",
                        adds_field=True, now=NOW)
    assert err.status == 400 and err.window is None
    # 99,783 for this input as it is (the figure), less what the field adds
    assert largest_output(bounds, _refused(bounds, limit=1_000_000).figures) == 99_783
    assert "max_output_tokens <= 99777" in err.message, err.message
    assert "Nothing is spent" in err.message and "not a spent limit" in err.message
    status, body = _rendered(err, CODEX)
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == "max_output_tokens"
    assert "resets_at" not in body["error"]


def test_a_spent_limit_stays_a_spent_limit() -> None:
    """When the request fits the limit but not what is left of it, the refusal is the
    spent window's (402, or Codex's usage-limit 429 with its reset)."""
    bounds = Bounds(input_tokens=1083, output_tokens=10_000, price=_price("gpt-6.2-sol"),
                    input_classes=frozenset(("input", "cache_read")))
    err = refusal_error(_refused(bounds, limit=1_000_000, committed=950_000), bounds,
                        endpoint="responses", now=NOW)
    assert err.status == 402 and err.window is not None
    assert "max_output_tokens <= 4783 would fit now" in err.message, err.message
    assert _rendered(err, CODEX)[0] == 429


def _model(**extra: Any) -> ModelSettings:
    return ModelSettings(name="gpt-5.1-codex", deployments=[Deployment(provider="p")],
                         max_output_tokens=128_000, **extra)


@pytest.mark.parametrize(("doc", "body_bytes", "tokens", "words"), [
    # Codex's 40 KB body with a hosted tool: the model's context window, not the bytes
    ({"input": "x", "tools": [{"type": "web_search"}]}, 40_000, 400_000,
     "up to 400000 input tokens (the model's context window, models[].max_input_tokens: "
     "tools[0].type=web_search makes the provider add input"),
    # the text counted with the model's encoding (below its bytes)
    ({"input": "hello"}, 40_000, 9_000,
     "up to 9000 input tokens (the body's text counted with o200k_base, plus allowances)"),
    ({"input": "hello"}, 40_000, 41_024, "up to 41024 input tokens (bounded by the body's "
                                         "bytes)"),
])
def test_every_refusal_names_its_input_bounds_true_basis(
        doc: dict[str, Any], body_bytes: int, tokens: int, words: str) -> None:
    """Issue 33: "400000 input tokens (bounded by the body's bytes)" for a 40 KB body
    whose bound is the context window: each basis is named as it is."""
    model = _model(max_input_tokens=400_000)
    bounds = Bounds(input_tokens=tokens, output_tokens=1, price=_price("gpt-5.1-codex"))
    assert input_words(bounds, doc, body_bytes, model).startswith(words)
    err = refusal_error(_refused(bounds, limit=10), bounds, endpoint="responses",
                        basis=input_words(bounds, doc, body_bytes, model), now=NOW)
    assert words in err.message


def test_the_last_refusal_says_what_one_more_turn_needs() -> None:
    """Claude Code at Opus prices, 75-80 % of a $1/day budget spent: the 402 says one more
    turn needs at least its input's price (and one output token), and how much that is."""
    bounds = Bounds(input_tokens=31_000, output_tokens=64_000,
                    price=_price("claude-opus-4-8"), input_basis="counted",
                    input_note="counted by the provider: 28500 + 1476 allowance + 1024 "
                               "tool-use prompt",
                    input_classes=frozenset(("input", "cache_read", "cache_write_5m")))
    err = refusal_error(_refused(bounds, limit=1_000_000, committed=790_000), bounds,
                        now=NOW)
    need = bounds.usd_of(1)
    assert err.status == 402
    assert (f"One more request like this one needs at least {need} µUSD "
            f"(${need / 1e6:.4f})") in err.message, err.message
    assert "210000 µUSD ($0.2100) remains" in err.message


def test_liability_is_said_to_be_the_holders_interrupted_requests() -> None:
    """A 402 whose counter holds liability says what it is (the unobserved part of the
    holder's own interrupted requests, how many), when it ends and who can end it."""
    bounds = _codex_bounds()
    err = refusal_error(_refused(bounds, limit=1_000_000, committed=500_000,
                                 liability=480_000), bounds, endpoint="responses",
                        interrupted=2, holder="team 'small'", now=NOW)
    assert ("Its liability of 480000 µUSD is the unobserved part of 2 of team 'small''s "
            "own interrupted requests") in err.message, err.message
    assert "ends when the window resets at 2026-12-08T00:00:00+00:00" in err.message
    assert "resolves those permits with the provider's figure" in err.message
    assert "1000+" in liability_words(5, "usd", interrupted=1000, holder="x", reset=NOW)
