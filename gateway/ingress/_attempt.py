"""One attempt: bound → admit → dispatch → settle exactly once, through the Governor.

The attempt holds its deployment's value of the request
(:class:`gateway.ingress._call.Call`), replaced only by the Call's named steps, called
from here: ``bound`` (the deployment's output cap, the off-loop count, a refinement
another deployment counted dropped, a count up front in ``refine_input: always``) and
``admit`` (what the Governor decided: the key resolved afresh after a snapshot mismatch,
a refined input or budget fit after a shortfall). From ``dispatching`` on the request is
what was admitted. The :class:`gateway.governance.Governor` owns the permit (admission
in one call, journal, the one settlement computation and its one call, replay). What the
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
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.config import Deployment
from gateway.errors import InferplaneError, SnapshotMismatch
from gateway.governance import (
    Ask,
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
    Refused,
    RequestFacts,
    Settlement,
    SettleResult,
    tpm_estimate,
)
from gateway.ingress._bounds import INLINE_BYTES, off_loop
from gateway.ingress._call import Call, capped, new_request_id
from gateway.ingress._client import ROUTES
from gateway.ingress._prepare import names_output_limit
from gateway.ingress._ratelimit import ratelimit_headers, refused_headers
from gateway.ingress._refine import Counting, note_admitted, refine
from gateway.ingress._shortfall import input_words, liability_context, refusal_error
from gateway.pricing import Usage
from gateway.providers import Provider

log = logging.getLogger("mayu.ingress")

__all__ = ["Attempt", "Call", "capped", "new_request_id", "outcome_for"]


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
    """This attempt's value of the request (replaced by ``bound`` and ``admit`` only)."""
    deployment: Deployment
    provider: Provider
    index: int
    permit: Permit | None = None
    settlement: Settlement | None = None
    result: SettleResult | None = None
    settled: bool = False
    dispatched: bool = False
    """Bytes of the request may have reached the upstream (cancelled vs uncertain)."""
    after: tuple[str, ...] = ()
    """The deployments this request tried before this one (a fallback: they failed)."""
    upstream_headers: dict[str, str] = field(default_factory=dict)
    """The client headers sent upstream, with this attempt's ``traceparent`` when traced
    (set by ``dispatching``)."""
    tier: str | None = None
    """``soft`` or ``standard`` for a model with ``routing.soft_tier`` (which tier this
    deployment is), else None: the answer's ``x-inferplane-tier``, the usage log's tier."""
    tier_kept: str | None = None
    """Past a soft budget, kept on the standard tier for this capability."""

    @property
    def request_id(self) -> str:
        rid = self.call.request_id
        return rid if self.index == 0 else f"{rid}.{self.index}"

    def headers(self) -> dict[str, str]:
        call = self.call
        h = {"x-inferplane-request-id": call.request_id,
             "x-inferplane-token-bound": str(call.token_bound),
             "x-inferplane-usd-bound": str(call.usd_bound)}
        if self.permit is not None:
            h["x-inferplane-permit"] = self.permit.id
            h.update(ratelimit_headers(self.permit, anthropic=call.endpoint == "messages"))
        if call.fitted:
            h["x-inferplane-budget-fit"] = call.fitted
        if call.bounds.refined:
            h["x-inferplane-input-bound"] = call.bounds.input_basis
        if call.output_cap is not None:
            h["x-inferplane-output-cap"] = str(call.output_cap)
        if self.tier is not None:
            h["x-inferplane-tier"] = self.tier
            if self.tier_kept is not None:
                h["x-inferplane-tier-kept"] = self.tier_kept
        return h

    async def bound(self) -> None:
        """This deployment's bounds before its admission: a refinement another deployment
        counted dropped, its output cap written, a large OpenAI body counted off the loop
        (once per request), and in ``refine_input: always`` the provider's count."""
        call = self.call.for_deployment(self.deployment).capped_for(self.deployment)
        if not call.counted_off_loop and len(call.client_body) > INLINE_BYTES:
            call = call.with_counted_input(await self._count_off_loop(call))
        refined = await refine(call, self.deployment, self.provider, refused=False)
        self.call = call if refined is None else call.refined(refined, self.deployment)

    async def _count_off_loop(self, call: Call) -> int | None:
        """A large OpenAI body's input counted in a worker thread (``_bounds.off_loop``:
        ``input_bound`` left it at its byte bound); None when it is not one to count."""
        start = time.perf_counter()
        counted = await off_loop(call.client_body, call.client_doc, call.model,
                                 call.bounds.byte_input)
        if counted is not None:
            metrics = call.gw.metrics
            labels = (self.deployment.provider, "tokenized")
            metrics.child(metrics.input_refinements, *labels).inc()
            metrics.child(metrics.input_refinement_latency, *labels).observe(
                time.perf_counter() - start)
        return counted

    def _ask(self) -> Ask:
        """What the Governor is told of this attempt: facts, and its input count."""
        call = self.call
        counting = (Counting(call, self.deployment, self.provider)
                    if call.endpoint == "messages" else None)
        return Ask(request_id=self.request_id, model=call.model.name,
                   principal=call.principal, bounds=call.bounds,
                   tpm=tpm_estimate(len(call.body)), key_hash=call.key_hash,
                   refinement=counting)

    async def admit(self) -> Permit:
        """Admit this (bound) attempt in one call to the Governor, which re-plans after a
        snapshot mismatch and tightens the bound after a shortfall; the request goes on as
        it was admitted, or its refusal is the client's error."""
        gw = self.call.gw
        try:
            with self.call.trace.span("admission", attempt=self.index):
                decided = await gw.governor.admit(self._ask())
        except Refused as refused:
            if refused.decided is not None:
                self.call = self.call.decided(refused.decided, self.deployment)
            gw.metrics.admissions.labels(f"refused_{refused.refusal.status}").inc()
            raise await self._refused(refused.refusal) from None
        except InferplaneError:
            gw.metrics.admissions.labels("error").inc()
            raise
        screened = self.call.principal.team.guardrails
        self.call = call = self.call.decided(decided, self.deployment)
        assert decided.permit is not None
        self.permit = permit = decided.permit
        if call.principal.team.guardrails != screened:
            # The team's profiles changed after this request was screened (a Principal
            # cached before the edit): its body was screened under the old ones, so it
            # must not leave. The permit is refunded; the retry is screened afresh.
            await self.finish(Outcome(kind=OutcomeKind.CANCELLED,
                                      detail="guardrail profiles changed"), status=503)
            raise SnapshotMismatch("the team's guardrail profiles changed while this "
                                   "request was admitted; retry")
        gw.metrics.admitted(permit, call.principal.team.name)
        note_admitted(call, self.deployment, self.provider)
        self.audit(event="admitted")
        return permit

    async def _refused(self, decision: Refusal) -> InferplaneError:
        """The client's error for a refusal (audited), in its protocol's headers."""
        call = self.call
        error = refusal_error(decision, call.bounds, endpoint=call.endpoint,
                              adds_field=not names_output_limit(call.doc),
                              basis=input_words(call.bounds, call.client_doc,
                                                len(call.client_body), call.model),
                              **await liability_context(call.gw.governance, decision,
                                                        call.principal))
        if decision.code == "rate_limited" and decision.figures is not None:
            error.extra_headers = refused_headers(
                decision.figures.limit, decision.figures.dimension,
                decision.retry_after, anthropic=call.endpoint == "messages")
        if call.bounds.refined:
            error.extra_headers["x-inferplane-input-bound"] = call.bounds.input_basis
        if call.output_cap is not None:
            error.extra_headers["x-inferplane-output-cap"] = str(call.output_cap)
        if self.after:  # nothing was sent to it: the fallback is not tried
            name = call.gw.router.name_of(call.model, self.deployment)
            error.message = (f"{', '.join(self.after)} failed; the fallback to {name} "
                             f"(bound {call.usd_bound} µUSD at its price) was not tried. "
                             f"{error.message}")
        self.audit(event="refused", status=decision.status, refusal=error.message,
                   counter=decision.counter)
        return error

    async def dispatching(self) -> None:
        """The request is about to leave: journaled (and audited) before the first byte."""
        assert self.permit is not None
        self.dispatched = True
        call = self.call
        self.upstream_headers = call.client_headers
        if call.trace.recording:  # this attempt's span, its traceparent sent upstream
            self.upstream_headers = call.trace.dispatch(
                self.index, deployment=call.gw.router.name_of(call.model, self.deployment),
                provider=self.provider.name,
                model=self.deployment.upstream_model or call.model.name,
                headers=call.client_headers)
        self.call.gw.router.sent(self.call.model, self.deployment)
        await self.call.gw.governor.dispatching(self.permit)
        self.audit(event="dispatch")

    async def finish(self, outcome: Outcome, *, status: int) -> Settlement | None:
        """Settle this attempt's permit once, in one call with what the wire said and
        the request's facts (the Governor computes the figures), and write its audit
        line; returns the settlement (None if there was no permit)."""
        if self.settled or self.permit is None:
            return self.settlement
        self.settled = True
        gw, call = self.call.gw, self.call
        if self.dispatched:
            gw.router.left(call.model, self.deployment)
        outcome = _known_ttl(outcome, call.bounds.input_classes)
        facts = RequestFacts(route=ROUTES.get(call.endpoint), client=call.client,
                             http_status=status,
                             deployment=gw.router.name_of(call.model, self.deployment))
        with call.trace.span("settlement", attempt=self.index):
            self.settlement, self.result = settlement, _ = await gw.governor.settle_outcome(
                self.permit, outcome, price=call.bounds.price, facts=facts)
            call.trace.settled(self.index, settlement, status=status)
        if settlement.bound_exceeded:
            self._bound_exceeded(settlement)
        if self.tier == "soft":
            await self._note_tier()
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

    async def _note_tier(self) -> None:
        """The request log's tier (only the soft one is written: None is the usual);
        the answer's header and the audit line say it whatever happens here."""
        assert self.permit is not None
        try:
            await self.call.gw.governance.note_tier(self.permit.id, "soft")
        except Exception as exc:  # a log column: never the request's failure
            log.warning("request %s: the tier of permit %s was not recorded: %s",
                        self.call.request_id, self.permit.id, exc)

    def _bound_exceeded(self, s: Settlement) -> None:
        call = self.call
        usage = s.usage or Usage()
        setting = ("max_output_tokens" if usage.output > call.bounds.output_tokens
                   else "count_allowance_pct (the provider's count was low)"
                   if call.bounds.refined else "input_overhead_tokens (or max_input_tokens)")
        call.gw.metrics.bound_exceeded.labels(call.model.name).inc()
        log.warning("bound_exceeded: permit %s (model %s) reported %d tokens / %d µUSD "
                    "above its admitted bound of %d tokens / %d µUSD; committed in full. "
                    "Raise models[%s].%s so admission reserves enough.",
                    self.permit.id if self.permit else "-", call.model.name,
                    s.tokens_committed, s.usd_committed, call.token_bound, call.usd_bound,
                    call.model.name, setting)

    def audit(self, **fields: Any) -> None:
        call = self.call
        call.trail.written = True
        call.gw.audit.write({
            "request_id": self.request_id, "attempt": self.index,
            "permit": self.permit.id if self.permit else None,
            "key_id": call.principal.key_id, "team_id": call.principal.team_id,
            "user": call.principal.user, "model": call.model.name,
            "provider": self.provider.name,
            "upstream_model": self.deployment.upstream_model or call.model.name,
            "endpoint": call.endpoint, "stream": call.stream,
            "token_bound": call.token_bound, "usd_bound": call.usd_bound,
            **({"input_bound": call.bounds.input_basis} if call.bounds.refined else {}),
            **({"output_cap": call.output_cap} if call.output_cap is not None else {}),
            # Guarded requests are marked: findings so far (docs/guardrails.md).
            **({"guardrails": call.guard.findings} if call.guard is not None else {}),
            **({"tier": self.tier} if self.tier is not None else {}),
            **fields})
