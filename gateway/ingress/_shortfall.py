"""When a request's worst case does not fit: say what to do, or fit it (opt-in).

A money or token-quota refusal carries the figures its counter held (limit, committed,
liability, reserved, leased, this request's amount). From them and the request's own
bound this module says, in the client's error, what the worst case was, the largest
``max_tokens`` that would fit now, and when the window resets — and sets ``Retry-After``
to that reset, never earlier, so agents do not hammer a budget that cannot free up.

**Budget fit** (opt-in per team, ``budget_fit_floor``, or per policy budget rule,
``onShortfall: fit``): when the largest fitting ``max_tokens`` is at least the floor, the
request is admitted with that output allowance instead — the forwarded body's
``max_tokens`` (or its protocol's equivalent) is lowered and nothing else changes — and
the response says so in ``x-inferplane-budget-fit``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from gateway.errors import (
    BudgetExhausted,
    GovernanceUnavailable,
    InferplaneError,
    RateLimited,
    SnapshotMismatch,
)
from gateway.governance import AdmissionRequest, Charge, Refusal, RefusalFigures
from gateway.governance._governor import is_snapshot_mismatch
from gateway.usage import Endpoint

_QUOTA_CODES = ("budget_exhausted", "token_quota_exhausted")


def window_reset(window: str) -> datetime:
    """When a captured UTC window ends: ``2026-12-01`` → next midnight, ``2026-12`` →
    the first of the next month."""
    if len(window) == 10:
        return datetime.strptime(window, "%Y-%m-%d").replace(tzinfo=UTC) + timedelta(days=1)
    year, month = (int(part) for part in window.split("-"))
    return datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)


def remaining(f: RefusalFigures) -> int:
    """What the counter could still take: limit − committed − liability − reserved − leased."""
    return max(0, (f.limit or 0) - f.committed - f.liability - f.reserved - f.leased)


@dataclass(frozen=True)
class Bounds:
    """The request's bounds, as a function of its output allowance."""

    input_tokens: int
    output_tokens: int
    usd_of: Callable[[int], int]
    """The µUSD bound of the same request with ``n`` output tokens."""


def largest_output(bounds: Bounds, f: RefusalFigures) -> int:
    """The largest output allowance with which the request would fit ``f`` now (-1: none)."""
    room = remaining(f)
    if f.dimension == "tokens":
        return min(bounds.output_tokens, room - bounds.input_tokens) if room >= \
            bounds.input_tokens else -1
    if bounds.usd_of(0) > room:
        return -1
    lo, hi = 0, bounds.output_tokens
    while lo < hi:  # the bound grows with the output allowance: bisect
        mid = (lo + hi + 1) // 2
        if bounds.usd_of(mid) <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _explain(refusal: Refusal, bounds: Bounds, now: datetime) -> tuple[str, int | None]:
    """The refusal's message with what to do, and the seconds until its window resets."""
    f = refusal.figures
    if f is None or refusal.code not in _QUOTA_CODES:
        return refusal.reason, None
    parts = [refusal.reason + ".",
             f"That is this request's worst case: up to {bounds.input_tokens} input tokens "
             f"and max_tokens {bounds.output_tokens}."]
    fits = largest_output(bounds, f)
    if fits >= 1:
        parts.append(f"The same request with max_tokens <= {fits} would fit now.")
    else:
        parts.append("No max_tokens fits now: the input alone does not fit what remains "
                     f"({remaining(f)} {'µUSD' if f.dimension == 'usd' else 'tokens'}).")
    wait = None
    if f.window:
        reset = window_reset(f.window)
        wait = max(1, int((reset - now).total_seconds()) + 1)
        parts.append(f"The {f.window} window resets at {reset.isoformat()} (in {wait} s).")
    return " ".join(parts), wait


def refusal_error(refusal: Refusal, bounds: Bounds, *,
                  now: datetime | None = None) -> InferplaneError:
    """The client error for a refusal: 429/402 with numbers, 503 to retry."""
    message, wait = _explain(refusal, bounds, now or datetime.now(UTC))
    if refusal.status == 429:
        return RateLimited(message, retry_after=wait or refusal.retry_after or 1)
    if refusal.status == 402:
        # No Retry-After earlier than the window reset: the budget cannot free up sooner
        # except by in-flight work settling, which a retry cannot count on.
        return BudgetExhausted(message, retry_after=wait)
    if is_snapshot_mismatch(refusal):
        return SnapshotMismatch(message, retry_after=refusal.retry_after or 1)
    return GovernanceUnavailable(message, retry_after=refusal.retry_after or 1)


def fit_charge(refusal: Refusal, request: AdmissionRequest | None) -> Charge | None:
    """The refusing charge, if budget fit is allowed on it."""
    if request is None or refusal.figures is None or refusal.code not in _QUOTA_CODES:
        return None
    for charge in request.charges:
        if charge.counter == refusal.counter and charge.fit_floor is not None:
            return charge
    return None


_OUTPUT_FIELDS: dict[Endpoint, tuple[str, ...]] = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "responses": ("max_output_tokens",),
    "messages": ("max_tokens",),
    "embeddings": (),
}


def lower_output(endpoint: Endpoint, doc: dict[str, Any], tokens: int
                 ) -> tuple[dict[str, Any], bytes]:
    """The body with its output allowance set to ``tokens`` (the field the client used,
    else the protocol's own); every other field is kept as it was."""
    fields = _OUTPUT_FIELDS[endpoint]
    present = [name for name in fields if name in doc]
    new = dict(doc)
    for name in present or fields[:1]:
        new[name] = tokens
    return new, msgspec.json.encode(new)
