"""When a request's worst case does not fit: say what to do, or fit it (opt-in).

A money or token-quota refusal carries the figures its counter held (limit, committed,
liability, reserved, leased, this request's amount). From them and the request's own
bound this module says, in the client's error, what the worst case was, the largest
``max_tokens`` that would fit now, and when the window resets (also in the headers:
:class:`gateway.errors.SpentWindow`). Such a refusal cannot clear before the reset
(in-flight work settling is nothing a retry can count on), so it says
``x-should-retry: false`` and has no ``Retry-After``: the SDKs sleep on whatever
``Retry-After`` says, hours until midnight, before retrying in vain.

:func:`refusal_error` maps each refusal code to its error kind (``_KINDS``, one table;
``docs/admission.md`` lists what each looks like to clients).

**Budget fit** (opt-in per team, ``budget_fit_floor``, or per policy budget rule,
``onShortfall: fit``): when the largest fitting ``max_tokens`` is at least the floor, the
request is admitted with that output allowance instead — the forwarded body's
``max_tokens`` (or its protocol's equivalent) is lowered and nothing else changes — and
the response says so in ``x-inferplane-budget-fit``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from gateway.errors import (
    AccountFrozen,
    BudgetExhausted,
    ConcurrencyLimited,
    GovernanceUnavailable,
    InferplaneError,
    LeaseExhausted,
    LeaseExpired,
    LeaseMissing,
    RateLimited,
    RuleUnsupported,
    SnapshotMismatch,
    SpendRateLimited,
    SpentWindow,
    TokenQuotaExhausted,
)
from gateway.governance import Bounds, Refusal, largest_output, remaining
from gateway.usage import Endpoint

_QUOTA_CODES = ("budget_exhausted", "token_quota_exhausted")

_KINDS: dict[str, type[InferplaneError]] = {
    "rate_limited": RateLimited,
    "token_quota_exhausted": TokenQuotaExhausted,
    "concurrency_limited": ConcurrencyLimited,
    "budget_exhausted": BudgetExhausted,
    "account_frozen": AccountFrozen,
    "snapshot_mismatch": SnapshotMismatch,
    "lease_missing": LeaseMissing,
    "lease_expired": LeaseExpired,
    "lease_exhausted": LeaseExhausted,
    "rule_unsupported": RuleUnsupported,
}
"""Each refusal code's error kind (its status agrees with ``gateway.governance.status_for``;
``tests/unit/test_retry_semantics.py`` checks every code)."""


def window_reset(window: str) -> datetime:
    """When a captured UTC window ends: ``2026-12-01`` → next midnight, ``2026-12`` →
    the first of the next month."""
    if len(window) == 10:
        return datetime.strptime(window, "%Y-%m-%d").replace(tzinfo=UTC) + timedelta(days=1)
    year, month = (int(part) for part in window.split("-"))
    return datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)








def _explain(refusal: Refusal, bounds: Bounds, now: datetime
             ) -> tuple[str, SpentWindow | None]:
    """The refusal's message with what to do, and the window it found spent."""
    f = refusal.figures
    if f is None or refusal.code not in _QUOTA_CODES:
        return refusal.reason, None
    n = bounds.choices
    per_choice = f" per choice × n={n}" if n > 1 else ""
    parts = [refusal.reason + ".",
             f"That is this request's worst case: {bounds.input_words()} "
             f"and max_tokens {bounds.output_tokens // n}{per_choice}."]
    fits = largest_output(bounds, f) // n  # the limit a client sets is per choice
    if fits >= 1:
        parts.append(f"The same request with max_tokens <= {fits}{per_choice} would fit "
                     "now.")
    else:
        parts.append("No max_tokens fits now: the input alone does not fit what remains "
                     f"({remaining(f)} {'µUSD' if f.dimension == 'usd' else 'tokens'}).")
    window = None
    if f.window:
        reset = window_reset(f.window)
        wait = max(1, int((reset - now).total_seconds()) + 1)
        parts.append(f"The {f.window} window resets at {reset.isoformat()} (in {wait} s).")
        window = SpentWindow(dimension=f.dimension, limit=f.limit or 0,
                             remaining=remaining(f), resets=reset)
    return " ".join(parts), window


def _error_kind(refusal: Refusal) -> type[InferplaneError]:
    """The error kind of a refusal: by its code, else by its status."""
    if refusal.code == "rate_limited" and refusal.status == 402:
        return SpendRateLimited  # a µUSD-per-minute bucket: a money refusal that refills
    kind = _KINDS.get(refusal.code or "")
    if kind is not None:
        return kind
    return {429: RateLimited, 402: BudgetExhausted}.get(refusal.status, GovernanceUnavailable)


def refusal_error(refusal: Refusal, bounds: Bounds, *,
                  now: datetime | None = None) -> InferplaneError:
    """The client error for a refusal: one that clears soon with its precise
    ``Retry-After``, one that cannot with ``x-should-retry: false`` and none."""
    message, window = _explain(refusal, bounds, now or datetime.now(UTC))
    kind = _error_kind(refusal)
    retry_after = (refusal.retry_after or 1) if kind.should_retry else None
    error = kind(message, retry_after=retry_after)
    error.window = window
    return error




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
