"""``GET /v1/me``: a key holder's own limits, what each holds now, and when it resets.

An engineer should learn about a budget before its 402. The limits that bind a key are
exactly the counters its next request would charge (:func:`gateway.governance.plan_charges`
with nothing to reserve: the key's and its team's RPM/TPM, token quota and money windows,
and every policy rule that applies to the key's team and user), so this view cannot list
a limit admission would not check, nor miss one. Each is read from the governance store
in one step (:meth:`GovernanceStore.figures`) and reported with the figures admission
compares: ``limit``, ``committed``, ``liability``, ``reserved`` (and ``leased``: what lease
grants hold of a policy budget in the shared profile), ``remaining`` (what the next
request may still reserve) and ``resets_at``. A rate bucket reports its balance and when
it is full again.

In the lease profile the figures are this plane's own: a policy budget's global spend
lives in inferplaned. A leased account's ``remaining`` is what the plane's next admission
allows (:func:`leased_remaining`: the lease's headroom, or what the budget had left at the
last heartbeat), never the global limit less this plane's own spend.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from gateway.governance import (
    BUCKET_SCALE,
    Charge,
    CounterKey,
    LeaseFigures,
    StoredFigures,
    is_slot,
    plan_charges,
)
from gateway.ingress._context import Gateway
from gateway.ingress._shortfall import holder_of, interrupted_requests, liability_words
from gateway.keys import Principal

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _at(now_us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=now_us)


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def window_reset(period: str) -> datetime:
    """When a UTC day (``2026-12-04``) or month (``2026-12``) window ends."""
    if len(period) == 10:
        return datetime.fromisoformat(f"{period}T00:00:00+00:00") + timedelta(days=1)
    year, month = int(period[:4]), int(period[5:7])
    return datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)


def _bucket(charge: Charge, held: StoredFigures) -> dict[str, Any]:
    capacity = charge.limit or 0
    balance = held.balance if held.balance is not None else capacity * BUCKET_SCALE
    missing = capacity * BUCKET_SCALE - balance
    full_in_us = -(-missing // capacity) if capacity and missing > 0 else 0
    return {"window": "minute", "period": None, "limit": capacity,
            "committed": None, "liability": None, "reserved": None, "leased": None,
            "remaining": max(0, balance // BUCKET_SCALE),
            "debt": max(0, -balance) // BUCKET_SCALE,
            "resets_at": _iso(_at(held.now_us + full_in_us))}


def leased_remaining(lease: LeaseFigures, used: int) -> int:
    """What a lease-profile plane's next admission allows on a leased account: the
    lease's headroom (admission clamps the limit to the allowance), or, for a larger
    charge, what the budget had left for anyone at the last heartbeat (the plane then
    asks for it and decides once more; a charge above both is a 402)."""
    return max(0, lease.allowance - used, lease.remaining)


def _window(charge: Charge, held: StoredFigures) -> dict[str, Any]:
    limit = charge.limit
    period = charge.window or ""
    used = held.committed + held.liability + held.reserved + held.leased
    remaining = None if limit is None else max(0, limit - used)
    if remaining is not None and held.lease is not None:
        remaining = min(remaining, leased_remaining(held.lease, used))
    entry = {"window": "day" if len(period) == 10 else "month", "period": period,
             "limit": limit, "committed": held.committed, "liability": held.liability,
             "reserved": held.reserved, "leased": held.leased, "remaining": remaining,
             "debt": None, "resets_at": _iso(window_reset(period))}
    if held.lease is not None:  # a lease-profile plane: its lease and the global budget
        entry["lease"] = msgspec.to_builtins(held.lease)
    return entry


def _slots(charge: Charge, held: StoredFigures) -> dict[str, Any]:
    """A concurrency rule's slots: ``reserved`` is the requests open now; no reset."""
    limit = charge.limit or 0
    return {"window": "in_flight", "period": None, "limit": limit, "committed": None,
            "liability": None, "reserved": held.reserved, "leased": None,
            "remaining": max(0, limit - held.reserved), "debt": None, "resets_at": None}


def limit_entry(charge: Charge, held: StoredFigures) -> dict[str, Any]:
    """One binding limit as ``GET /v1/me`` lists it."""
    name = CounterKey.parse(charge.counter)
    figures = (_bucket(charge, held) if charge.kind == "bucket"
               else _slots(charge, held) if is_slot(charge) else _window(charge, held))
    return {"counter": charge.counter, "owner": name.owner if name else "policy",
            "rule": charge.rule_uid, "scope": name.scope if name and name.scope else None,
            "dimension": charge.dimension, "kind": charge.kind, **figures,
            "hard": charge.hard, "frozen": held.frozen}


async def me_report(gw: Gateway, principal: Principal) -> dict[str, Any]:
    """The caller's key, team, user and every limit that binds its next request."""
    snapshot = gw.policy.snapshot()
    charges = list(plan_charges(principal, snapshot, token_bound=0, usd_bound=0,
                                now=datetime.now(UTC)))
    held = await gw.governance.figures(charges)
    now_us = max((f.now_us for f in held.values()), default=None)
    as_of = _at(now_us) if now_us is not None else datetime.now(UTC)
    return {"object": "me", "as_of": _iso(as_of),
            "key": {"id": principal.key_id, "prefix": principal.key_prefix,
                    "allowed_models": (None if principal.allowed_models is None
                                       else list(principal.allowed_models))},
            "team": {"id": principal.team.id, "name": principal.team.name},
            "user": principal.user, "policy_generation": snapshot.generation,
            "limits": [await _with_liability(gw, principal, limit_entry(c, held[c.counter]))
                       for c in charges]}


async def _with_liability(gw: Gateway, principal: Principal,
                          entry: dict[str, Any]) -> dict[str, Any]:
    """A window holding liability says what it is: how many of the holder's own
    interrupted requests, when it ends, who can resolve it (``liability_note``)."""
    if not entry.get("liability") or not entry.get("period"):
        return entry
    holder, own = holder_of(entry["counter"], principal)
    count = await interrupted_requests(gw.governance, own, period=entry["period"],
                                       dimension=entry["dimension"])
    return {**entry, "interrupted": count, "liability_note": liability_words(
        entry["liability"], entry["dimension"], interrupted=count, holder=holder,
        reset=window_reset(entry["period"]))}
