"""What one client request is, as a value: who, which model, which body, which bounds.

:class:`Call` is built once by the prepare stage (``gateway.ingress._dispatch.prepare``)
and never edited: each later step returns a new value from a named method here, so what
a stage may change is exactly what its method replaces (the stages and their order:
``gateway.ingress._dispatch``):

- :meth:`Call.for_deployment` — an attempt's start: the deployment's price (``bounds``
  price, when the deployment has its own), a refinement another deployment counted is
  dropped (``bounds`` back to the byte bound);
- :meth:`Call.capped_for` — the deployment's output cap written into a body that names no
  limit (``doc``, ``body``, ``bounds`` output, ``output_cap``);
- :meth:`Call.with_counted_input` — the off-loop count of a large body (``bounds`` input);
- :meth:`Call.refined` — the provider's count of the input, up front in
  ``refine_input: always`` (``bounds`` input, and which deployment counted it);
- :meth:`Call.decided` — what admission decided (``gateway.governance.Governor.admit``):
  the key resolved afresh after a snapshot mismatch (``principal``), a refined input
  (``bounds``), budget fit's lower output allowance (:meth:`Call.fitted_to`: ``doc``,
  ``body``, ``bounds`` output, ``fitted``).

The mutable parts are :class:`AuditTrail` (whether an audit line was written), shared
by every value of one request so the error renderer does not write a second one, and
the request's :class:`gateway.telemetry.RequestTrace` (its spans), told each stage.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec.structs import force_setattr, replace

from gateway.config import Deployment, ModelSettings
from gateway.governance import Bounds, Decided, Fit
from gateway.ingress._prepare import CAPPED, names_output_limit, output_bound, output_cap
from gateway.ingress._refine import count_scope
from gateway.ingress._shortfall import lower_output
from gateway.keys import Principal
from gateway.providers import Provider
from gateway.telemetry import OFF, RequestTrace
from gateway.usage import Endpoint

if TYPE_CHECKING:
    from gateway.guardrails import Guard
    from gateway.ingress._context import Gateway


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


class AuditTrail:
    """Whether some attempt already wrote this request's audit line(s)."""

    __slots__ = ("written",)

    def __init__(self) -> None:
        self.written = False


def capped(doc: dict[str, Any], endpoint: Endpoint, cap: int | None
           ) -> tuple[dict[str, Any], bytes] | None:
    """The client's body with the operator's output cap written as its limit (the
    protocol's own field, as budget fit writes it), or None when the cap does not apply:
    off, not a chat-completions or Responses request, or the client named a limit."""
    if cap is None or endpoint not in CAPPED or names_output_limit(doc):
        return None
    return lower_output(endpoint, doc, cap)


class Call(msgspec.Struct, frozen=True):
    """One client request, after authentication, parsing, routing and bounding."""

    gw: Gateway
    principal: Principal
    endpoint: Endpoint
    model: ModelSettings
    doc: dict[str, Any]
    """The body as forwarded (the client's, or with a cap or budget fit's limit)."""
    body: bytes
    stream: bool
    bounds: Bounds
    client_headers: dict[str, str]
    deployments: list[tuple[Deployment, Provider]]
    """The model's deployments that speak this ingress's protocol, in fallback order."""
    request_id: str = msgspec.field(default_factory=new_request_id)
    key_hash: str = ""
    """SHA-256 of the presented key, to re-authenticate after a snapshot mismatch."""
    client: str | None = None
    """The client tool its User-Agent names (gateway.ingress._client), for the log."""
    client_doc: dict[str, Any] = msgspec.field(default_factory=dict)
    """The body as the client sent it (``doc`` before any cap or budget fit)."""
    client_body: bytes = b""
    output_cap: int | None = None
    """The operator's output cap written into the forwarded body (None: none written)."""
    fitted: str | None = None
    """Set when budget fit lowered the output allowance (the response header says so)."""
    refined_for: str | None = None
    """The count scope (deployment) whose count refined ``bounds`` (None: not refined)."""
    counted_off_loop: bool = False
    """The input was offered to the off-loop count (``_bounds.off_loop``, once per call)."""
    trail: AuditTrail = msgspec.field(default_factory=AuditTrail)
    guard: Guard | None = None
    """The request's guardrails (its pseudonyms), set by the screen step; None: off."""
    trace: RequestTrace = OFF
    """The request's spans (``gateway.telemetry``; OFF: tracing off), told each stage."""

    def __post_init__(self) -> None:
        if not self.client_body:
            force_setattr(self, "client_doc", self.doc)
            force_setattr(self, "client_body", self.body)

    @property
    def token_bound(self) -> int:
        return self.bounds.tokens

    @property
    def usd_bound(self) -> int:
        return self.bounds.usd

    @property
    def audited(self) -> bool:
        return self.trail.written

    def for_deployment(self, deployment: Deployment) -> Call:
        """This request as ``deployment``'s attempt starts it: bounded at the deployment's
        price (its own, else the model's), and a refined bound another deployment counted
        dropped (a fallback starts again from the byte bound)."""
        call = self
        price = deployment.price or self.model.price
        if price != self.bounds.price:
            call = replace(call, bounds=replace(self.bounds, price=price))
        if self.refined_for is None or self.refined_for == count_scope(self, deployment):
            return call
        return replace(call, bounds=call.bounds.unrefined(), refined_for=None)

    def capped_for(self, deployment: Deployment) -> Call:
        """This deployment's output cap written into a request that names no limit, and
        its output bounded by it (``docs/bounds.md``, "An opt-in output cap"). A fallback
        to a deployment with another cap (or none) starts again from the client's body;
        a lower limit budget fit already wrote is kept."""
        cap = output_cap(self.model, deployment)
        if cap == self.output_cap:
            return self
        written = capped(self.client_doc, self.endpoint, cap)
        if written is None and self.output_cap is None:
            return self  # the common case: no cap, or a request the cap does not touch
        doc, body = written or (self.client_doc, self.client_body)
        out = output_bound(doc, self.endpoint, self.model,
                           ceiling=self.gw.settings.server.max_output_tokens)
        cap_written = cap if written is not None else None
        if self.fitted and self.bounds.output_tokens <= out:
            return replace(self, output_cap=cap_written)  # budget fit's lower limit stands
        return replace(self, doc=doc, body=body, bounds=self.bounds.with_output(out),
                       output_cap=cap_written)

    def with_counted_input(self, counted: int | None) -> Call:
        """The off-loop count of the body's text taken (once per request; None: the
        body was not one to count there)."""
        bounds = self.bounds if counted is None else self.bounds.with_counted_input(counted)
        return replace(self, bounds=bounds, counted_off_loop=True)

    def refined(self, bounds: Bounds, deployment: Deployment) -> Call:
        """The input bound refined by ``deployment``'s count (``gateway.ingress._refine``)."""
        return replace(self, bounds=bounds, refined_for=count_scope(self, deployment))

    def fitted_to(self, per_choice: int, why: str) -> Call:
        """Budget fit: the forwarded body's output limit lowered to ``per_choice``."""
        doc, body = lower_output(self.endpoint, self.doc, per_choice)
        return replace(self, doc=doc, body=body, fitted=why,
                       bounds=self.bounds.with_output(per_choice * self.bounds.choices))

    def decided(self, decided: Decided, deployment: Deployment) -> Call:
        """This request as the Governor admitted (or refused) it on ``deployment``: the
        principal resolved afresh after a snapshot mismatch, the bounds refined or
        fitted after a shortfall, budget fit's limit written into the forwarded body."""
        call, bounds = self, decided.bounds
        if decided.principal is not self.principal:
            call = replace(call, principal=decided.principal)
        if decided.fit is not None:
            call = call.fitted_to(decided.fit.per_choice, _fit_words(decided.fit, bounds))
        if bounds is not call.bounds:
            refined = (bounds.input_tokens, bounds.input_basis, bounds.counted) != (
                self.bounds.input_tokens, self.bounds.input_basis, self.bounds.counted)
            call = (call.refined(bounds, deployment) if refined
                    else replace(call, bounds=bounds))
        return call


def _fit_words(fit: Fit, bounds: Bounds) -> str:
    """The ``x-inferplane-budget-fit`` header: what budget fit lowered, and why."""
    n = bounds.choices
    return (f"max_tokens lowered from {fit.before} to {fit.per_choice}"
            f"{f' per choice (n={n})' if n > 1 else ''} to fit {fit.counter} "
            f"({fit.remaining} left; input bound {bounds.input_basis}: "
            f"{bounds.input_tokens} tokens)")
