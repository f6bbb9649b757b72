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

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from gateway.config import ModelSettings
from gateway.errors import (
    AccountFrozen,
    BadRequest,
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
from gateway.governance import (
    Bounds,
    CounterKey,
    GovernanceStore,
    LogFilter,
    Refusal,
    RefusalFigures,
    largest_output,
    remaining,
)
from gateway.ingress._bounds import external_input
from gateway.ingress._tokenize import encoding_name
from gateway.keys import Principal
from gateway.usage import Endpoint

log = logging.getLogger("mayu.ingress")

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








_OUTPUT_FIELD: dict[str, str] = {"chat": "max_tokens", "responses": "max_output_tokens",
                                  "messages": "max_tokens"}
"""The output limit a client of each protocol sets (what a refusal advises it to lower)."""


def _usd(micros: int) -> str:
    return f"{micros} µUSD (${micros / 1e6:.4f})"


def _amount(f: RefusalFigures, amount: int) -> str:
    return _usd(amount) if f.dimension == "usd" else f"{amount} tokens"


def with_field(bounds: Bounds, field: str) -> Bounds:
    """``bounds`` of the same body with ``"<field>": <n>`` added, as a client following
    the advice sends it: a field adds at most its JSON bytes (≤ len(field) + 12 for a
    7-digit value), which also covers its tokens with the counted ceiling's allowances
    (``gateway.ingress._tokenize``)."""
    return msgspec.structs.replace(bounds, input_tokens=bounds.input_tokens + len(field) + 12)


def own_bound(refusal: Refusal, bounds: Bounds) -> bool:
    """The refusal's cause is the request's own bound, not spend: the counter holds
    nothing (no commit, liability, reservation or lease), so its worst case is more than
    the whole limit, and a smaller output allowance fits. No reset would admit it as it
    is and the client can fix it now: a request error, never a spent limit."""
    f = refusal.figures
    return (f is not None and refusal.code in _QUOTA_CODES and f.limit is not None
            and f.committed == f.liability == f.reserved == f.leased == 0
            and f.amount > f.limit and largest_output(bounds, f) // bounds.choices >= 1)


def _one_more(f: RefusalFigures, bounds: Bounds, field: str, fits: int) -> str:
    """What one more request like this one needs at the least, and what is left: the
    price of its input bound alone (the part no output limit can lower)."""
    if f.dimension == "tokens":
        need = _amount(f, bounds.input_tokens + 1)
    else:
        need = _usd(bounds.usd_of(1))
    left = _amount(f, remaining(f))
    return (f"{'' if fits >= 1 else f'No {field} fits now: '}One more request like this "
            f"one needs at least {need} to be admitted (its input bound alone, "
            f"{bounds.input_tokens} tokens at its dearest input class, and one output "
            f"token), and {left} remain{'s' if f.dimension == 'usd' else ''}.")


def liability_words(liability: int, dimension: str, *, interrupted: int | None,
                    holder: str, reset: datetime) -> str:
    """What a counter's liability is, when it ends and who can end it sooner."""
    unit = "µUSD" if dimension == "usd" else "tokens"
    many = ("some" if interrupted is None else
            f"{interrupted}{'+' if interrupted >= LIABILITY_SCAN else ''}")
    return (f"Its liability of {liability} {unit} is the unobserved part of {many} of "
            f"{holder}'s own interrupted requests in this window (the provider never "
            f"reported all of their usage, so the rest of their bound still counts); it "
            f"ends when the window resets at {reset.isoformat()}, or sooner when an "
            "operator resolves those permits with the provider's figure (mayu permits "
            "resolve, POST /admin/v1/permits/{id}/resolve).")


LIABILITY_SCAN = 1000
"""The most interrupted requests a refusal or ``/v1/me`` counts (then: "1000+")."""


def input_words(bounds: Bounds, doc: dict[str, Any], body_bytes: int,
                model: ModelSettings) -> str:
    """The input bound in a refusal's words, with its true basis: a refinement's own
    note, the model's context window (a request the provider adds input to), a count
    with the model's encoding, or the body's bytes."""
    n = bounds.input_tokens
    if bounds.refined:
        return bounds.input_words()
    window = model.max_input_tokens
    reason = external_input(doc)
    if reason is not None and window is not None and n == window and n > body_bytes:
        return (f"up to {n} input tokens (the model's context window, "
                f"models[].max_input_tokens: {reason} makes the provider add input the "
                "body does not carry)")
    if n < body_bytes + model.input_overhead_tokens:
        return (f"up to {n} input tokens (the body's text counted with "
                f"{encoding_name(model) or 'the model’s encoding'}, plus allowances)")
    return bounds.input_words()


_LIABLE = ("uncertain", "tokens_known")
"""The outcomes that leave liability (an interrupted request; a write of unknown TTL)."""


def holder_of(counter: str, principal: Principal) -> tuple[str, LogFilter | None]:
    """Whose counter this is, in words, and the request-log filter of its own requests
    (None: a counter the log cannot select, such as a policy rule's own scope)."""
    name = CounterKey.parse(counter)
    if name is None:
        return "the holder", None
    team = f"team {principal.team.name!r}"
    if name.subject == "key":
        return f"key {principal.key_prefix}", LogFilter(key_id=name.id)
    if name.subject == "team":
        return team, LogFilter(team_id=name.id)
    if name.subject == "member":
        return f"{name.scope!r} in {team}", LogFilter(team_id=name.id, user=name.scope)
    if name.subject == "user":
        return f"user {name.scope!r}", LogFilter(user=name.scope)
    scope = dict(part.split("=", 1) for part in name.scope.split(",") if "=" in part)
    if set(scope) == {"team"} and scope["team"] == principal.team.name:
        return team, LogFilter(team_id=principal.team.id)
    if set(scope) == {"user"}:
        return f"user {scope['user']!r}", LogFilter(user=scope["user"])
    return "the holder", None


async def interrupted_requests(store: GovernanceStore, own: LogFilter | None, *,
                               period: str, dimension: str) -> int | None:
    """How many of the holder's own requests of the window ``period`` still hold
    liability (at most :data:`LIABILITY_SCAN`); None when the store cannot tell."""
    if own is None or not period:
        return None
    day = period if len(period) == 10 else f"{period}-01"
    start = datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC)
    count = 0
    try:
        for status in _LIABLE:
            rows = await store.request_log(
                msgspec.structs.replace(own, status=status, since=start,
                                        until=window_reset(period)),
                limit=LIABILITY_SCAN)
            count += sum(1 for p in rows if ((p.usd_liability if dimension == "usd"
                                              else p.tokens_liability) or 0) > 0)
    except Exception:  # wording only: the refusal stands without the count
        log.warning("liability: could not count the interrupted requests", exc_info=True)
        return None
    return min(count, LIABILITY_SCAN)


async def liability_context(store: GovernanceStore, refusal: Refusal,
                            principal: Principal) -> dict[str, Any]:
    """``refusal_error``'s ``interrupted`` and ``holder`` for a refusal whose counter
    holds liability (nothing to look up otherwise)."""
    f = refusal.figures
    if f is None or not f.liability or refusal.code not in _QUOTA_CODES:
        return {}
    holder, own = holder_of(refusal.counter or "", principal)
    return {"holder": holder,
            "interrupted": await interrupted_requests(store, own, period=f.window or "",
                                                      dimension=f.dimension)}


def _explain(refusal: Refusal, bounds: Bounds, now: datetime, *, field: str,
             adds_field: bool = False, basis: str | None = None,
             interrupted: int | None = None, holder: str = "the holder"
             ) -> tuple[str, SpentWindow | None]:
    """The refusal's message with what to do, and the window it found spent."""
    f = refusal.figures
    if f is None or refusal.code not in _QUOTA_CODES:
        return refusal.reason, None
    n = bounds.choices
    per_choice = f" per choice × n={n}" if n > 1 else ""
    basis = basis or bounds.input_words()
    parts = [refusal.reason + ".",
             f"That is this request's worst case: {basis} "
             f"and {field} {bounds.output_tokens // n}{per_choice}."]
    # the limit a client sets is per choice; setting one adds its field to the body
    fits = largest_output(with_field(bounds, field) if adds_field else bounds, f) // n
    if own_bound(refusal, bounds):
        parts.insert(1, f"Nothing is spent: the request's own worst case is more than the "
                        f"whole limit ({_amount(f, f.amount)} > {_amount(f, f.limit or 0)}),"
                        " so it is not a spent limit, and no window reset admits it as it "
                        "is.")
        parts.append(f"Set {field} <= {fits}{per_choice}: the same request would fit now.")
        return " ".join(parts), None
    if fits >= 1:
        parts.append(f"The same request with {field} <= {fits}{per_choice} would fit "
                     "now.")
    parts.append(_one_more(f, bounds, field, fits))
    window = None
    if f.window:
        reset = window_reset(f.window)
        wait = max(1, int((reset - now).total_seconds()) + 1)
        parts.append(f"The {f.window} window resets at {reset.isoformat()} (in {wait} s).")
        if f.liability:
            parts.append(liability_words(f.liability, f.dimension, interrupted=interrupted,
                                         holder=holder, reset=reset))
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


def refusal_error(refusal: Refusal, bounds: Bounds, *, endpoint: Endpoint = "messages",
                  adds_field: bool = False, basis: str | None = None,
                  interrupted: int | None = None, holder: str = "the holder",
                  now: datetime | None = None) -> InferplaneError:
    """The client error for a refusal: one that clears soon with its precise
    ``Retry-After``, one that cannot with ``x-should-retry: false`` and none; one whose
    cause is the request's own bound (:func:`own_bound`) a 400 naming the output limit
    to lower, so no client shows it as a spent limit (Codex's "You've hit your usage
    limit": ``gateway.ingress._render.codex_usage_limit`` needs the spent window).
    ``adds_field``: the request names no output limit, so the advised one adds its
    field to the body (:func:`with_field`)."""
    field = _OUTPUT_FIELD.get(endpoint, "max_tokens")
    message, window = _explain(refusal, bounds, now or datetime.now(UTC), field=field,
                               adds_field=adds_field, basis=basis,
                               interrupted=interrupted, holder=holder)
    if own_bound(refusal, bounds):
        return BadRequest(message, param=field)
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
