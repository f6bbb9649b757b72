"""The remaining-limit headers each protocol's clients know, from what admission read.

OpenAI clients read ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (reset as a
duration, e.g. ``6m0s``); Anthropic clients ``anthropic-ratelimit-{requests,tokens}-
{limit,remaining,reset}`` (reset as an RFC 3339 time). The figures are the tightest of
the buckets (key, team, policy rate rules) this permit charged, right after its own
reservation — the balances the admission already returned, so no extra round trip. A
request no bucket limits gets none of these headers.

A refusal on a spent day or month window (a token quota, a money budget) says when that
window resets in ``x-inferplane-window-reset`` (RFC 3339; the protocols have no money
headers), and a token quota also in the protocol's token headers — the reset time a
client can wait for, since its ``Retry-After`` is left out (``gateway.ingress._shortfall``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gateway.errors import SpentWindow
from gateway.governance import BUCKET_SCALE, Permit

_DIMENSIONS = {"requests": "requests", "tokens": "tokens"}


def _duration(seconds: int) -> str:
    """``45s``, ``6m0s``, ``14h57m20s``: the form OpenAI's reset headers use."""
    minutes, secs = divmod(max(0, seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def _rfc3339(moment: datetime) -> str:
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _tightest(permit: Permit, dimension: str) -> tuple[int, int, int] | None:
    """(limit, remaining, seconds until full) of the tightest bucket of a dimension."""
    best: tuple[float, int, int, int] | None = None
    for charge in permit.request.charges:
        if charge.kind != "bucket" or charge.dimension != dimension or not charge.limit:
            continue
        balance = permit.buckets.get(charge.counter)
        if balance is None:
            continue
        cap = charge.limit
        remaining = max(0, balance // BUCKET_SCALE)
        missing = cap * BUCKET_SCALE - balance
        full_in = max(0, -(-missing // cap)) // 1_000_000  # µs → whole seconds
        ratio = remaining / cap
        if best is None or ratio < best[0]:
            best = (ratio, cap, remaining, int(full_in))
    return None if best is None else best[1:]


def ratelimit_headers(permit: Permit, *, anthropic: bool,
                      now: datetime | None = None) -> dict[str, str]:
    now = now or datetime.now(UTC)
    headers: dict[str, str] = {}
    for dimension in _DIMENSIONS:
        found = _tightest(permit, dimension)
        if found is None:
            continue
        limit, remaining, full_in = found
        if anthropic:
            reset = now + timedelta(seconds=full_in)
            headers[f"anthropic-ratelimit-{dimension}-limit"] = str(limit)
            headers[f"anthropic-ratelimit-{dimension}-remaining"] = str(remaining)
            headers[f"anthropic-ratelimit-{dimension}-reset"] = _rfc3339(reset)
        else:
            headers[f"x-ratelimit-limit-{dimension}"] = str(limit)
            headers[f"x-ratelimit-remaining-{dimension}"] = str(remaining)
            headers[f"x-ratelimit-reset-{dimension}"] = _duration(full_in)
    return headers


def refused_headers(limit: int | None, dimension: str, retry_after: int | None, *,
                    anthropic: bool, now: datetime | None = None) -> dict[str, str]:
    """The same headers on a rate refusal: nothing remains until ``retry_after``."""
    if not limit or dimension not in _DIMENSIONS:
        return {}
    wait = retry_after or 1
    if anthropic:
        reset = (now or datetime.now(UTC)) + timedelta(seconds=wait)
        return {f"anthropic-ratelimit-{dimension}-limit": str(limit),
                f"anthropic-ratelimit-{dimension}-remaining": "0",
                f"anthropic-ratelimit-{dimension}-reset": _rfc3339(reset)}
    return {f"x-ratelimit-limit-{dimension}": str(limit),
            f"x-ratelimit-remaining-{dimension}": "0",
            f"x-ratelimit-reset-{dimension}": _duration(wait)}


def window_headers(window: SpentWindow, *, anthropic: bool,
                   now: datetime | None = None) -> dict[str, str]:
    """A refusal on a spent window: when it resets, and for tokens what it has left."""
    headers = {"x-inferplane-window-reset": _rfc3339(window.resets)}
    if window.dimension != "tokens":
        return headers
    if anthropic:
        return {**headers, "anthropic-ratelimit-tokens-limit": str(window.limit),
                "anthropic-ratelimit-tokens-remaining": str(window.remaining),
                "anthropic-ratelimit-tokens-reset": _rfc3339(window.resets)}
    wait = int((window.resets - (now or datetime.now(UTC))).total_seconds()) + 1
    return {**headers, "x-ratelimit-limit-tokens": str(window.limit),
            "x-ratelimit-remaining-tokens": str(window.remaining),
            "x-ratelimit-reset-tokens": _duration(wait)}
