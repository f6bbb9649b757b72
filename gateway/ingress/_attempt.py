"""One attempt: admit → dispatch → settle exactly once, through the Governor.

The attempt says what happened; the :class:`gateway.governance.Governor` owns the permit
(admission with re-plan, journal, the one settlement computation, replay). What the
attempt reports (DESIGN §5):

- the upstream's usage, final (``complete``; ``tokens_known`` when a cache write's TTL is
  missing) or as far as it arrived before a cut (``uncertain``: observed classes commit,
  the rest of the bound is liability);
- ``cancelled`` when nothing left the gateway (connect refused, a local error before the
  first byte went upstream);
- ``invalid`` for negative, overflowing or non-integer usage (nothing committed, the
  accounts frozen, the client gets a 502);
- a definite upstream HTTP error status: ``complete`` with zero usage.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import msgspec

from gateway.config import Deployment, ModelSettings
from gateway.errors import InferplaneError
from gateway.governance import (
    AdmissionRequest,
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
    Refused,
    RequestFacts,
    Settlement,
    SettleResult,
    build_request,
    tpm_estimate,
)
from gateway.ingress._bounds import off_loop
from gateway.ingress._client import ROUTES
from gateway.ingress._context import Gateway
from gateway.ingress._prepare import CAPPED, names_output_limit, output_bound, output_cap
from gateway.ingress._ratelimit import ratelimit_headers, refused_headers
from gateway.ingress._refine import BYTE, note_admitted, refine, reset_for
from gateway.ingress._renew import mismatch_kind, renew
from gateway.ingress._shortfall import (
    Bounds,
    fit_charge,
    is_shortfall,
    largest_output,
    lower_output,
    refusal_error,
    remaining,
)
from gateway.keys import Principal
from gateway.pricing import INPUT_CLASSES, InvalidUsage, Usage, cost_bound_micro_usd
from gateway.providers import Provider
from gateway.usage import Endpoint

log = logging.getLogger("mayu.ingress")

_FIT_ROUNDS = 3
"""Admission tries with budget fit: each may lower the output allowance for one more
refusing counter (a team's day and month windows, a policy budget)."""
_REFINE_ROUNDS = 2
"""Admission tries after a refined input bound (a cached/prefix bound, then a count)."""


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


@dataclass
class Call:
    """One client request, after authentication, parsing, routing and bounding."""

    gw: Gateway
    principal: Principal
    endpoint: Endpoint
    model: ModelSettings
    doc: dict[str, Any]
    body: bytes
    stream: bool
    input_bound: int
    output_bound: int
    usd_bound: int
    client_headers: dict[str, str]
    deployments: list[tuple[Deployment, Provider]]
    """The model's deployments that speak this ingress's protocol, in fallback order."""
    request_id: str = field(default_factory=new_request_id)
    audited: bool = False
    """Some attempt already wrote this request's audit line(s)."""
    key_hash: str = ""
    """SHA-256 of the presented key, to re-authenticate after a snapshot mismatch."""
    usd_bound_of: Callable[[int], int] | None = None
    """The µUSD bound of this request with ``n`` output tokens (for refusals and fit)."""
    input_classes: frozenset[str] = INPUT_CLASSES
    """The price classes its input can be billed in (gateway.ingress._bounds)."""
    fitted: str | None = None
    """Set when budget fit lowered the output allowance (the response header says so)."""
    byte_input_bound: int = 0
    """The input bound from the body's bytes (``input_bound`` before any refinement)."""
    input_basis: str = BYTE
    """What ``input_bound`` rests on (``gateway.ingress._refine``: byte, counted, ...)."""
    input_note: str = ""
    """How a refined bound was had, for refusals and budget-fit headers."""
    refined_for: str | None = None
    """The deployment whose count refined ``input_bound`` (None: not refined)."""
    count_tried: bool = False
    """The provider was asked for a count for this bound (at most once per attempt)."""
    output_cap: int | None = None
    """The operator's output cap written into the forwarded body (None: none written)."""
    client_doc: dict[str, Any] = field(default_factory=dict)
    """The body as the client sent it (``doc`` before any cap or budget fit)."""
    client_body: bytes = b""
    off_loop_tried: bool = False
    """The input was offered to the off-loop count (``_bounds.off_loop``, once per call)."""
    client: str | None = None
    """The client tool its User-Agent names (gateway.ingress._client), for the log."""

    def __post_init__(self) -> None:
        self.byte_input_bound = self.byte_input_bound or self.input_bound
        self.client_doc = self.client_doc or self.doc
        self.client_body = self.client_body or self.body

    @property
    def token_bound(self) -> int:
        return self.input_bound + self.output_bound

    def bounds(self) -> Bounds:
        usd_of = self.usd_bound_of or (lambda n: self.usd_bound)
        n = self.doc.get("n") if self.endpoint == "chat" else None
        return Bounds(input_tokens=self.input_bound, output_tokens=self.output_bound,
                      usd_of=usd_of, input_basis=self.input_basis,
                      input_note=self.input_note,
                      choices=n if isinstance(n, int) and not isinstance(n, bool)
                      and n > 1 else 1)


def capped(doc: dict[str, Any], endpoint: Endpoint, cap: int | None
           ) -> tuple[dict[str, Any], bytes] | None:
    """The client's body with the operator's output cap written as its limit (the
    protocol's own field, as budget fit writes it), or None when the cap does not apply:
    off, not a chat-completions or Responses request, or the client named a limit."""
    if cap is None or endpoint not in CAPPED or names_output_limit(doc):
        return None
    return lower_output(endpoint, doc, cap)


def outcome_for(usage: Usage | None, *, detail: str = "") -> Outcome:
    """The outcome of a finished answer: its final usage, or uncertain without one."""
    if usage is None:
        return Outcome(kind=OutcomeKind.UNCERTAIN, detail=detail or "upstream reported no usage")
    return Outcome(kind=OutcomeKind.COMPLETE, usage=usage, detail=detail)


def _known_ttl(outcome: Outcome, classes: frozenset[str]) -> Outcome:
    """Cache writes reported without their TTL, by a request that asked for no 1h TTL,
    are 5m writes: the provider bills the TTL the breakpoint asked for (docs/bounds.md),
    so their price is certain and nothing of them needs to be liability."""
    usage = outcome.usage
    if usage is None or not usage.cache_write_unknown or "cache_write_1h" in classes:
        return outcome
    known = msgspec.structs.replace(
        usage, cache_write_5m=usage.cache_write_5m + usage.cache_write_unknown,
        cache_write_unknown=0)
    return msgspec.structs.replace(outcome, usage=known)


@dataclass
class Attempt:
    call: Call
    deployment: Deployment
    provider: Provider
    index: int
    permit: Permit | None = None
    settlement: Settlement | None = None
    result: SettleResult | None = None
    settled: bool = False
    planned: AdmissionRequest | None = None
    """The last plan handed to the Governor (a refusal names one of its counters)."""
    dispatched: bool = False
    """Bytes of the request may have reached the upstream (cancelled vs uncertain)."""

    @property
    def request_id(self) -> str:
        rid = self.call.request_id
        return rid if self.index == 0 else f"{rid}.{self.index}"

    def headers(self) -> dict[str, str]:
        h = {"x-inferplane-request-id": self.call.request_id,
             "x-inferplane-token-bound": str(self.call.token_bound),
             "x-inferplane-usd-bound": str(self.call.usd_bound)}
        if self.permit is not None:
            h["x-inferplane-permit"] = self.permit.id
            h.update(ratelimit_headers(self.permit,
                                       anthropic=self.call.endpoint == "messages"))
        if self.call.fitted:
            h["x-inferplane-budget-fit"] = self.call.fitted
        if self.call.input_basis != BYTE:
            h["x-inferplane-input-bound"] = self.call.input_basis
        if self.call.output_cap is not None:
            h["x-inferplane-output-cap"] = str(self.call.output_cap)
        return h

    def _cap_output(self) -> None:
        """Write this deployment's output cap into a request that names no limit and
        bound its output by it (``docs/bounds.md``, "An opt-in output cap"). A fallback
        to a deployment with another cap (or none) starts again from the client's body;
        a lower limit budget fit already wrote is kept."""
        call = self.call
        cap = output_cap(call.model, self.deployment)
        if cap == call.output_cap:
            return
        written = capped(call.client_doc, call.endpoint, cap)
        if written is None and call.output_cap is None:
            return  # the common case: no cap, or a request the cap does not touch
        doc, body = written or (call.client_doc, call.client_body)
        out = output_bound(doc, call.endpoint, call.model,
                           ceiling=call.gw.settings.server.max_output_tokens)
        call.output_cap = cap if written is not None else None
        if call.fitted and call.output_bound <= out:
            return  # budget fit's lower limit stands
        call.doc, call.body, call.output_bound = doc, body, out
        call.usd_bound = call.usd_bound_of(out) if call.usd_bound_of else call.usd_bound

    async def _count_off_loop(self) -> None:
        """Count a large OpenAI body's input in a worker thread (``_bounds.off_loop``:
        ``input_bound`` left it at its byte bound) and bound the input by it, once per
        call: the count is the model's, so a fallback attempt keeps it."""
        call = self.call
        if call.off_loop_tried:
            return
        call.off_loop_tried = True
        start = time.perf_counter()
        counted = await off_loop(call.client_body, call.client_doc, call.model,
                                 call.byte_input_bound)
        if counted is None:
            return
        metrics = call.gw.metrics
        labels = (self.deployment.provider, "tokenized")
        metrics.child(metrics.input_refinements, *labels).inc()
        metrics.child(metrics.input_refinement_latency, *labels).observe(
            time.perf_counter() - start)
        if counted >= call.byte_input_bound:
            return
        call.byte_input_bound = call.input_bound = counted
        call.usd_bound_of = partial(cost_bound_micro_usd, counted, price=call.model.price,
                                    input_classes=call.input_classes)
        call.usd_bound = call.usd_bound_of(call.output_bound)

    def _plan(self) -> AdmissionRequest:
        call = self.call
        self.planned = build_request(
            call.principal, call.gw.policy.snapshot(), request_id=self.request_id,
            model=call.model.name, token_bound=call.token_bound, usd_bound=call.usd_bound,
            now=datetime.now(UTC), tpm=tpm_estimate(len(call.body)))
        return self.planned

    def _fit(self, refusal: Refusal) -> bool:
        """Budget fit: lower the output allowance to the largest that fits the refusing
        counter, if the counter allows it and that is at least its floor."""
        charge = fit_charge(refusal, self.planned)
        call = self.call
        if charge is None or refusal.figures is None or call.usd_bound_of is None:
            return False
        # The limit is per choice: a chat request with n choices may generate n times
        # it, so the allowance that fits is split between them.
        n = call.doc.get("n") if call.endpoint == "chat" else None
        choices = n if isinstance(n, int) and n > 1 else 1
        per_choice = largest_output(call.bounds(), refusal.figures) // choices
        if (per_choice < max(1, charge.fit_floor or 0)
                or per_choice * choices >= call.output_bound):
            return False
        before = call.output_bound // choices
        call.doc, call.body = lower_output(call.endpoint, call.doc, per_choice)
        call.output_bound = per_choice * choices
        call.usd_bound = call.usd_bound_of(call.output_bound)
        call.fitted = (f"max_tokens lowered from {before} to {per_choice}"
                       f"{f' per choice (n={choices})' if choices > 1 else ''} to fit "
                       f"{refusal.counter} ({remaining(refusal.figures)} left; input bound "
                       f"{call.input_basis}: {call.input_bound} tokens)")
        return True

    async def _tighten(self, refusal: Refusal) -> bool:
        """After a money or quota refusal: refine the input bound one step
        (gateway.ingress._refine: a cached or prefix-extended count, then the provider's
        count), else lower the output allowance (budget fit); True if one applied."""
        if not is_shortfall(refusal):
            return False
        return (await refine(self.call, self.deployment, self.provider, refused=True)
                or self._fit(refusal))

    async def _replan(self, refusal: Refusal, request: AdmissionRequest) -> None:
        call, gw = self.call, self.call.gw
        gw.metrics.snapshot_retries.labels(mismatch_kind(refusal)).inc()
        principal = await renew(gw, refusal, key_hash=call.key_hash, model=call.model.name,
                                used_generation=request.policy_generation)
        if principal is not None:
            call.principal = principal

    async def admit(self) -> Permit:
        """Admit this attempt (the Governor re-plans after a snapshot mismatch)."""
        gw = self.call.gw
        self._cap_output()
        await self._count_off_loop()
        reset_for(self.call, self.deployment)
        await refine(self.call, self.deployment, self.provider, refused=False)
        for _ in range(_FIT_ROUNDS + _REFINE_ROUNDS):
            try:
                permit = await gw.governor.admit(self._plan, replan=self._replan)
                break
            except Refused as refused:
                decision = refused.refusal
                if await self._tighten(decision):
                    continue  # admit the same request with a tighter bound
                gw.metrics.admissions.labels(f"refused_{decision.status}").inc()
                error = refusal_error(decision, self.call.bounds())
                if decision.code == "rate_limited" and decision.figures is not None:
                    error.extra_headers = refused_headers(
                        decision.figures.limit, decision.figures.dimension,
                        decision.retry_after, anthropic=self.call.endpoint == "messages")
                if self.call.input_basis != BYTE:
                    error.extra_headers["x-inferplane-input-bound"] = self.call.input_basis
                if self.call.output_cap is not None:
                    error.extra_headers["x-inferplane-output-cap"] = str(self.call.output_cap)
                self.audit(event="refused", status=decision.status, refusal=error.message,
                           counter=decision.counter)
                raise error from None
            except InferplaneError:
                gw.metrics.admissions.labels("error").inc()
                raise
        else:
            raise refusal_error(decision, self.call.bounds())
        gw.metrics.admitted(permit, self.call.principal.team.name)
        note_admitted(self.call, self.deployment, self.provider)
        self.permit = permit
        self.audit(event="admitted")
        return permit

    async def dispatching(self) -> None:
        """The request is about to leave: journaled (and audited) before the first byte."""
        assert self.permit is not None
        self.dispatched = True
        await self.call.gw.governor.dispatching(self.permit)
        self.audit(event="dispatch")

    async def finish(self, outcome: Outcome, *, status: int) -> Settlement | None:
        """Settle this attempt's permit once (the Governor computes the figures) and
        write its audit line; returns the settlement (None if there was no permit)."""
        if self.settled or self.permit is None:
            return self.settlement
        self.settled = True
        gw, call = self.call.gw, self.call
        outcome = _known_ttl(outcome, call.input_classes)
        try:
            settlement = gw.governor.settlement(self.permit, outcome, call.model.price)
        except InvalidUsage as exc:
            outcome = Outcome(kind=OutcomeKind.INVALID, detail=str(exc))
            settlement = gw.governor.settlement(self.permit, outcome)
        settlement = msgspec.structs.replace(settlement, facts=RequestFacts(
            route=ROUTES.get(call.endpoint), client=call.client, http_status=status,
            deployment=f"{self.deployment.provider}/"
                       f"{self.deployment.upstream_model or call.model.name}"))
        self.settlement = settlement
        if settlement.bound_exceeded:
            self._bound_exceeded(settlement)
        self.result = await gw.governor.settle(self.permit, settlement)
        self.audit(event="settled", status=status, outcome=str(settlement.kind),
                   detail=settlement.detail,
                   usage=None if settlement.usage is None
                   else msgspec.to_builtins(settlement.usage),
                   tokens_committed=settlement.tokens_committed,
                   usd_committed=settlement.usd_committed,
                   tokens_liability=settlement.tokens_liability,
                   usd_liability=settlement.usd_liability,
                   bound_exceeded=settlement.bound_exceeded,
                   stored=self.result is not None)
        return settlement

    def _bound_exceeded(self, s: Settlement) -> None:
        call = self.call
        usage = s.usage or Usage()
        setting = ("max_output_tokens" if usage.output > call.output_bound
                   else "input_overhead_tokens (or max_input_tokens)")
        call.gw.metrics.bound_exceeded.labels(call.model.name).inc()
        log.warning("bound_exceeded: permit %s (model %s) reported %d tokens / %d µUSD "
                    "above its admitted bound of %d tokens / %d µUSD; committed in full. "
                    "Raise models[%s].%s so admission reserves enough.",
                    self.permit.id if self.permit else "-", call.model.name,
                    s.tokens_committed, s.usd_committed, call.token_bound, call.usd_bound,
                    call.model.name, setting)

    def audit(self, **fields: Any) -> None:
        call = self.call
        call.audited = True
        self.call.gw.audit.write({
            "request_id": self.request_id, "attempt": self.index,
            "permit": self.permit.id if self.permit else None,
            "key_id": call.principal.key_id, "team_id": call.principal.team_id,
            "user": call.principal.user, "model": call.model.name,
            "provider": self.provider.name,
            "upstream_model": self.deployment.upstream_model or call.model.name,
            "endpoint": call.endpoint, "stream": call.stream,
            "token_bound": call.token_bound, "usd_bound": call.usd_bound,
            **({"input_bound": call.input_basis} if call.input_basis != BYTE else {}),
            **({"output_cap": call.output_cap} if call.output_cap is not None else {}),
            **fields})
