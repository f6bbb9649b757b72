"""Rate-limit headers feed routing: an answer saying a limit has nothing left makes its
deployment full until the reset (new requests go to the others first), in both
providers' header shapes; a 429 without ``retry-after`` cools down until that reset."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from gateway.config import ModelSettings
from gateway.providers._base import ratelimit_of
from gateway.routing import Router, exhausted_s

NOW = datetime(2026, 12, 7, 18, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, None),
    ({"x-ratelimit-remaining-requests": "12", "x-ratelimit-reset-requests": "1s"}, None),
    ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s"}, 360.0),
    ({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "20ms"}, 0.02),
    ({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1h2m3.5s"}, 3723.5),
    ({"anthropic-ratelimit-requests-remaining": "0",
      "anthropic-ratelimit-requests-reset": "2026-12-07T18:00:30Z"}, 30.0),
    ({"anthropic-ratelimit-output-tokens-remaining": "0",
      "anthropic-ratelimit-output-tokens-reset": "2026-12-07T18:00:05+00:00",
      "anthropic-ratelimit-requests-remaining": "0",
      "anthropic-ratelimit-requests-reset": "2026-12-07T18:00:02Z"}, 5.0),
    ({"anthropic-ratelimit-tokens-remaining": "0",
      "anthropic-ratelimit-tokens-reset": "soon"}, 1.0),
    ({"anthropic-ratelimit-tokens-remaining": "0"}, 1.0),
    ({"anthropic-ratelimit-requests-remaining": "0",
      "anthropic-ratelimit-requests-reset": "2026-12-07T17:59:00Z"}, 0.0),
])
def test_exhaustion_is_read_from_either_providers_headers(
        headers: dict[str, str], expected: float | None) -> None:
    """Only a limit at 0 counts; its reset in OpenAI's duration or Anthropic's RFC 3339
    form (the latest of several; 1 s when unreadable or absent; 0 when past)."""
    got = exhausted_s(headers, NOW)
    assert got == (None if expected is None else pytest.approx(expected))


def test_only_rate_limit_headers_are_kept() -> None:
    """Routing keeps the rate-limit headers of an answer, and nothing else."""
    assert ratelimit_of({"content-type": "application/json", "x-request-id": "r",
                         "x-ratelimit-limit-requests": "60",
                         "anthropic-ratelimit-tokens-remaining": "5"}) == {
        "x-ratelimit-limit-requests": "60", "anthropic-ratelimit-tokens-remaining": "5"}


def _model() -> ModelSettings:
    return msgspec.convert({"name": "m", "routing": {"strategy": "ordered"},
                            "deployments": [{"provider": "a"}, {"provider": "b"}]},
                           ModelSettings)


def test_an_exhausted_deployment_goes_after_the_others_until_its_reset() -> None:
    """Full (after the others, not a failure) until the reset; headroom reported again
    ends it at once."""
    clock, model = Clock(), _model()
    router = Router(clock=clock)
    a = model.deployments[0]
    cands = [(d, d.provider) for d in model.deployments]
    reset = (datetime.now(UTC) + timedelta(seconds=30)).isoformat()
    router.succeeded(model, a, ratelimit={"anthropic-ratelimit-requests-remaining": "0",
                                          "anthropic-ratelimit-requests-reset": reset})
    assert [p for _, p in router.plan(model, cands).order] == ["b", "a"]  # full, not out
    assert router.snapshot(model)["a/m"]["failures"] == 0
    clock.t += 31
    assert [p for _, p in router.plan(model, cands).order] == ["a", "b"]
    router.succeeded(model, a, ratelimit={"x-ratelimit-remaining-requests": "0",
                                          "x-ratelimit-reset-requests": "10s"})
    assert [p for _, p in router.plan(model, cands).order] == ["b", "a"]
    router.succeeded(model, a, ratelimit={"x-ratelimit-remaining-requests": "3"})
    assert [p for _, p in router.plan(model, cands).order] == ["a", "b"]  # headroom again
