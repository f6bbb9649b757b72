"""Refusals with the same code, figures and wording from every store.

A store reports a fact — which counter refused, its code and the figures it held
(:class:`RefusalFigures`) — and :func:`refusal` words it, so the local and the shared
profile answer a client identically (the store contract tests pin it). The ingress maps
each code to its error kind and protocol shape (``gateway.ingress._shortfall``).
"""

from __future__ import annotations

import msgspec

from gateway.governance._model import Refusal, RefusalFigures

_STATUS = {"rate_limited": 429, "token_quota_exhausted": 429, "concurrency_limited": 429,
           "budget_exhausted": 402,
           "account_frozen": 402, "snapshot_mismatch": 503,
           # The lease profile's own refusals (gateway.lease): the authority is elsewhere.
           # The lease ones clear once the control plane answers; rule_unsupported only
           # once the rule or this build changes (the ingress says: do not retry).
           "rule_unsupported": 503, "lease_missing": 503, "lease_expired": 503,
           "lease_exhausted": 503}


class LeaseFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What a lease-profile refusal is about (the data plane's view of its lease)."""

    gate: str = ""
    """rule_unsupported: why this data plane cannot enforce the rule."""
    renewals: int = 0
    """lease_expired: how many renew intervals passed without an answer."""
    started: bool = False
    """lease_missing: the control plane has answered since this data plane started."""
    allowance: int = 0
    """lease_exhausted: this data plane's allowance (µUSD)."""
    remaining: int = 0
    """lease_exhausted: what the budget had left across all data planes (µUSD)."""


def _unit(figures: RefusalFigures) -> str:
    return "µUSD" if figures.dimension == "usd" else figures.dimension


def _lease_reason(code: str, counter: str, lease: LeaseFacts) -> str:
    if code == "rule_unsupported":
        return lease.gate
    if code == "lease_expired":
        return (f"{counter}: the budget lease from the control plane expired (no heartbeat "
                f"answered for {lease.renewals} renew intervals); this FailClosed hard cap "
                "refuses until inferplaned answers again")
    if code == "lease_missing":
        since = ("one was requested" if lease.started else
                 "the control plane has not answered since this data plane started")
        return (f"{counter}: no budget lease from the control plane yet for this FailClosed "
                f"hard cap ({since}); retry shortly")
    return (f"{counter}: this data plane's lease allowance ({lease.allowance} µUSD) is used "
            f"up and a renewal is on its way (the budget had {lease.remaining} µUSD left "
            "across all data planes); retry shortly")


def _reason(code: str, counter: str, f: RefusalFigures | None, frozen_by: str | None,
            retry_after: int | None) -> str:
    if code == "snapshot_mismatch":
        return (f"{counter}: changed since the request was authenticated or routed "
                "(snapshot mismatch); retry")
    if code == "account_frozen":
        by = f" for permit {frozen_by}" if frozen_by else ""
        return (f"{counter}: account is frozen after invalid usage was reported{by}; an "
                "operator must resolve it")
    if f is None:
        return f"{counter}: {code}"
    if code == "rate_limited":
        return (f"{counter}: {f.dimension} per minute limit {f.limit} exhausted (this "
                f"request {f.amount}); retry in {retry_after or 1}s")
    if code == "concurrency_limited":
        return (f"{counter}: in-flight limit {f.limit} reached ({f.reserved} requests "
                f"open); retry when one finishes")
    leased = f" + leased {f.leased}" if f.leased else ""
    return (f"{counter}: limit {f.limit} {_unit(f)} would be exceeded: committed "
            f"{f.committed} + liability {f.liability} + reserved {f.reserved}{leased} + "
            f"this request's worst case {f.amount}")


def status_for(code: str, figures: RefusalFigures | None = None) -> int:
    """The HTTP status of a refusal: decided here only, never by a store. A rate limit
    on money (a µUSD-per-minute bucket) is a money refusal, 402, like a money budget."""
    if code == "rate_limited" and figures is not None and figures.dimension == "usd":
        return 402
    return _STATUS.get(code, 503)


def refusal(code: str, counter: str, *, figures: RefusalFigures | None = None,
            retry_after: int | None = None, frozen_by: str | None = None,
            lease: LeaseFacts | None = None) -> Refusal:
    """The refusal for ``code`` on ``counter`` (a token quota answers 429, money 402)."""
    status = status_for(code, figures)
    if (status == 503 or code == "concurrency_limited") and retry_after is None:
        retry_after = 1  # a slot frees when any open request ends: retry soon
    reason = (_lease_reason(code, counter, lease) if lease is not None
              else _reason(code, counter, figures, frozen_by, retry_after))
    return Refusal(status=status, counter=counter, code=code, figures=figures,
                   retry_after=retry_after, reason=reason)
