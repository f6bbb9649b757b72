"""The remaining-limit headers each protocol's clients know, from what admission read.

OpenAI clients read ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (reset as a
duration, e.g. ``6m0s``); Anthropic clients ``anthropic-ratelimit-{requests,tokens}-
{limit,remaining,reset}`` (reset as an RFC 3339 time). The figures are the tightest of
the buckets (key, team, policy rate rules) this permit charged, right after its own
reservation — the balances the admission already returned, so no extra round trip. A
request no bucket limits gets none of these headers.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gateway.governance import BUCKET_SCALE, Permit

_DIMENSIONS = {"requests": "requests", "tokens": "tokens"}


def _duration(seconds: int) -> str:
    minutes, secs = divmod(max(0, seconds), 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


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
            reset = (now + timedelta(seconds=full_in)).replace(microsecond=0)
            headers[f"anthropic-ratelimit-{dimension}-limit"] = str(limit)
            headers[f"anthropic-ratelimit-{dimension}-remaining"] = str(remaining)
            headers[f"anthropic-ratelimit-{dimension}-reset"] = \
                reset.isoformat().replace("+00:00", "Z")
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
        reset = ((now or datetime.now(UTC)) + timedelta(seconds=wait)).replace(microsecond=0)
        return {f"anthropic-ratelimit-{dimension}-limit": str(limit),
                f"anthropic-ratelimit-{dimension}-remaining": "0",
                f"anthropic-ratelimit-{dimension}-reset": reset.isoformat().replace(
                    "+00:00", "Z")}
    return {f"x-ratelimit-limit-{dimension}": str(limit),
            f"x-ratelimit-remaining-{dimension}": "0",
            f"x-ratelimit-reset-{dimension}": _duration(wait)}
