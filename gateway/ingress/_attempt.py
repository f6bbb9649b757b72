"""One attempt: admit → dispatch → settle exactly once, with audit and metrics.

Settlement follows what was observed (DESIGN §5): ``complete`` when every class is known
and priced, ``tokens_known`` when a cache write's TTL is missing, ``uncertain`` when the
outcome is partial or ambiguous (stream cut, timeout after dispatch, client disconnect:
the bounds are kept), ``invalid`` for negative or absurd usage (nothing committed, the
accounts frozen, the client gets a 502), ``cancelled`` when nothing was dispatched. An
upstream HTTP error status is a definite answer with no generated tokens: it settles
``complete`` with zero usage (one request counted, no money).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from gateway.config import Deployment, ModelSettings
from gateway.errors import (
    BudgetExhausted,
    GovernanceUnavailable,
    InferplaneError,
    RateLimited,
    SnapshotMismatch,
)
from gateway.governance import (
    AdmissionRequest,
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
    SettleResult,
    build_request,
    commits_for,
)
from gateway.ingress._context import Gateway
from gateway.ingress._renew import (
    MAX_SNAPSHOT_RETRIES,
    is_snapshot_mismatch,
    mismatch_kind,
    renew,
)
from gateway.keys import Principal
from gateway.pricing import InvalidUsage, Usage, cost_micro_usd
from gateway.providers import Provider
from gateway.usage import Endpoint

log = logging.getLogger("mayu.ingress")

# Pauses between settlement tries while the store is unavailable (None: give up).
_SETTLE_RETRY_DELAYS = (0.05, 0.25, 1.0, None)


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

    @property
    def token_bound(self) -> int:
        return self.input_bound + self.output_bound


def outcome_for(usage: Usage | None, call: Call, *, detail: str = "") -> Outcome:
    """The settlement outcome of reported usage; raises InvalidUsage above the bounds.

    The bounds are conservative, so usage above them is an absurd report (or a model
    misconfigured with too small a ``max_input_tokens``): committing it could carry a
    hard limit past its cap, so it is invalid — nothing committed, accounts frozen.
    """
    if usage is None:
        return Outcome(kind=OutcomeKind.UNCERTAIN, detail=detail or "upstream reported no usage")
    tokens, cost = usage.total_tokens(), cost_micro_usd(usage, call.model.price)
    if tokens > call.token_bound or cost > call.usd_bound:
        raise InvalidUsage(f"reported usage ({tokens} tokens, {cost} µUSD) exceeds the "
                           f"admitted bound ({call.token_bound} tokens, {call.usd_bound} µUSD)")
    if not usage.price_certain:
        return Outcome(kind=OutcomeKind.TOKENS_KNOWN, usage=usage,
                       detail=detail or "cache-write TTL not reported: price kept at bound")
    return Outcome(kind=OutcomeKind.COMPLETE, usage=usage, cost_micro_usd=cost, detail=detail)


def refusal_error(refusal: Refusal) -> InferplaneError:
    if refusal.status == 429:
        return RateLimited(refusal.reason, retry_after=refusal.retry_after or 1)
    if refusal.status == 402:
        return BudgetExhausted(refusal.reason)
    if is_snapshot_mismatch(refusal):
        return SnapshotMismatch(refusal.reason, retry_after=refusal.retry_after or 1)
    return GovernanceUnavailable(refusal.reason, retry_after=refusal.retry_after or 1)


@dataclass
class Attempt:
    call: Call
    deployment: Deployment
    provider: Provider
    index: int
    permit: Permit | None = None
    result: SettleResult | None = None
    settled: bool = False
    dispatched: bool = False
    """The request may have reached the upstream (decides cancelled vs uncertain)."""

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
        return h

    async def admit(self) -> Permit:
        """Admit this attempt, re-planning after a snapshot mismatch (bounded).

        Each round plans from one Principal and one policy snapshot, so a permit is
        always admitted entirely under one snapshot, never a mix.
        """
        call, gw = self.call, self.call.gw
        for retry in range(MAX_SNAPSHOT_RETRIES + 1):
            snapshot = gw.policy.snapshot()
            decision = await self._decide(build_request(
                call.principal, snapshot, request_id=self.request_id,
                model=call.model.name, token_bound=call.token_bound,
                usd_bound=call.usd_bound, now=datetime.now(UTC)))
            if not is_snapshot_mismatch(decision) or retry == MAX_SNAPSHOT_RETRIES:
                break
            assert isinstance(decision, Refusal)
            gw.metrics.snapshot_retries.labels(mismatch_kind(decision)).inc()
            principal = await renew(gw, decision, key_hash=call.key_hash,
                                    model=call.model.name,
                                    used_generation=snapshot.generation)
            if principal is not None:
                call.principal = principal
        if isinstance(decision, Refusal):
            gw.metrics.admissions.labels(f"refused_{decision.status}").inc()
            self.audit(status=decision.status, refusal=decision.reason,
                       counter=decision.counter)
            raise refusal_error(decision)
        gw.metrics.admitted(decision, call.principal.team.name)
        self.permit = decision
        return decision

    async def _decide(self, request: AdmissionRequest) -> Permit | Refusal:
        """One admission call to the store, timed; store failures become 503."""
        gw = self.call.gw
        started = time.perf_counter()
        try:
            return (await gw.governance.admit([request]))[0]
        except InferplaneError:
            gw.metrics.admissions.labels("error").inc()
            raise
        except Exception as exc:
            gw.metrics.admissions.labels("error").inc()
            log.error("admission failed: %s", exc)
            raise GovernanceUnavailable("governance store unavailable") from exc
        finally:
            gw.metrics.admission_latency.observe(time.perf_counter() - started)

    async def finish(self, outcome: Outcome, *, status: int) -> SettleResult | None:
        """Settle this attempt's permit (once) and write its audit line."""
        if self.settled or self.permit is None:
            return self.result
        self.settled = True
        gw = self.call.gw
        error = None
        commits = commits_for(self.permit.request, outcome)
        for delay in _SETTLE_RETRY_DELAYS:
            try:
                self.result = await gw.governance.settle(self.permit.id, outcome, commits)
                error = None
                break
            except GovernanceUnavailable as exc:
                # Settlement is idempotent for one outcome, so retrying after an ambiguous
                # failure either settles or replays; it never debits twice.
                error = f"{type(exc).__name__}: {exc}"
                if delay is not None:
                    await asyncio.sleep(delay)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                break
        if error is not None:
            # The permit stays pending and keeps binding its bounds (DESIGN §5) until an
            # operator resolves it (`mayu permits resolve`).
            log.error("settlement of permit %s failed: %s", self.permit.id, error)
        gw.metrics.settled(self.permit, str(outcome.kind),
                           None if self.result is None else self.result.usd_committed)
        self.audit(status=status, outcome=str(outcome.kind), detail=outcome.detail,
                   usage=None if outcome.usage is None else msgspec.to_builtins(outcome.usage),
                   cost_micro_usd=outcome.cost_micro_usd, settle_error=error,
                   tokens_committed=self.result and self.result.tokens_committed,
                   usd_committed=self.result and self.result.usd_committed)
        return self.result

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
            "token_bound": call.token_bound, "usd_bound": call.usd_bound, **fields})
