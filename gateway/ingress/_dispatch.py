"""A generation request's stages in the order they run, and how its answer goes back.

:func:`serve` lists them: **prepare** (authenticate, read, parse, route, bound: the
request built once as a :class:`gateway.ingress._call.Call` value), **route** (the
deployments in the order to try: ``gateway.routing``'s balancing, health and cache
affinity for a model with ``routing``, else the listed order), then per deployment
in that order **bound** (the deployment's cap and counts), **admit** (the Governor:
one permit, or the client's refusal), **dispatch** (the upstream call, the answer relayed
as JSON or SSE) and **settle** (exactly once, as the answer ends, however it ends). Which
stage may change what:

- prepare builds every field of the Call; nothing after it edits one in place;
- bound and admit replace the attempt's Call by the Call's named steps (its bounds, the
  forwarded body and its output limit, the principal after a snapshot mismatch);
- dispatch and settle only read it: what was admitted is what is sent and settled; a
  fallback's next attempt starts from the value the previous one was admitted with.

A fallback is tried only while no byte has reached the client: after a connect error,
a timeout, or a retryable status (429/5xx). Each attempt has its own permit and is
settled (journaled, the store asked) before the next one is admitted; a refusal of the
next one while the store is still taking it is decided again once it has (Governor).

What the settlement is told (DESIGN §5):

- a failure before the first byte of the request was written upstream (connect refused,
  DNS, pool timeout, a local error before ``send``) → cancelled, nothing charged;
- after bytes were written and before any answer → uncertain (the bound is liability);
- a definite upstream error status → complete with zero usage (a proxy's give-up
  statuses 408/502/504/524 are ambiguous: uncertain);
- a stream cut after a partial relay → what arrived commits (Anthropic's
  ``message_start`` input and cache classes, one output token per content event; for
  a chat or Responses stream that relayed content, the input text counted exactly by
  ``gateway.ingress._tokenize.proven_input`` where that counter applies), the
  rest is liability — and the client gets the protocol's own error event, never a clean
  end, so its SDK raises.

Streams are relayed event by event as they arrive. A stream that ends with its
protocol's end marker is settled (and audited) before the event carrying the marker is
relayed, so the client never holds a finished answer its replica has not journaled and
audited. Otherwise settlement runs in the relay's ``finally`` (shielded from the
cancellation a client disconnect delivers), and the reply's ``after`` hook (run once
the response is over, ``gateway.ingress._reply``) closes the relay, so a disconnect
while the relay is parked at a ``yield`` — or before it ever started — still settles.
After a client disconnect the upstream request is aborted at once
(``server.drain_on_disconnect_s`` = 0), or read on, discarded, for up to that many
seconds so the exact usage can still be settled. Either way the relay checks between
upstream chunks whether the client left (its :class:`Hangup`) and the drain checks its
deadline there too: a cancellation reaches a task only while it waits, and one whose
upstream data is always already buffered (a fast upstream) never waits. So after the
disconnect is seen the relay reads at most the one chunk in hand (the client's unread
buffer: ≤ 256 KiB plus one socket read) before it stops.

A stream the server cancels at its drain deadline (``server.shutdown_grace_s``) settles
here too, as "cut at shutdown": what it relayed commits, the rest of the bound is
liability; the Governor's own shutdown settlement then leaves it alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC, datetime
from functools import partial
from typing import Any

import anyio

from gateway.errors import UpstreamUnavailable
from gateway.governance import Bounds, Outcome, OutcomeKind, soft_charges
from gateway.guardrails import GuardrailBlocked, guard_request, stream_filter
from gateway.ingress._attempt import Attempt, outcome_for
from gateway.ingress._bounds import choices, input_bound, input_classes
from gateway.ingress._call import Call, new_request_id
from gateway.ingress._client import client_tool
from gateway.ingress._context import Gateway
from gateway.ingress._dedupe import deduplicated
from gateway.ingress._prepare import (
    credential_key_hash,
    output_bound,
    parse_json,
    receive_body,
    route,
    upstream_body,
    wants_stream,
)
from gateway.ingress._reply import CLIENT_LEFT, CUT_AT_SHUTDOWN, Hangup, Reply
from gateway.ingress._tokenize import proven_input
from gateway.keys import Principal
from gateway.policy import tenant_guardrails
from gateway.pricing import InvalidUsage, Usage
from gateway.providers import (
    RETRYABLE_STATUS,
    Protocol_,
    Provider,
    UpstreamFailure,
    UpstreamResponse,
)
from gateway.routing import (
    STANDARD,
    Plan,
    Session,
    TierChoice,
    choose_tier,
    exhausted_s,
    retry_after_s,
    session_of,
)
from gateway.telemetry import OFF, RequestTrace
from gateway.usage import Endpoint, StreamMeter, extract_json, stream_error_event

log = logging.getLogger("mayu.ingress")


class InvalidUpstreamUsage(UpstreamUnavailable):
    """The upstream reported invalid usage; nothing was committed."""

    code = "invalid_upstream_usage"


_FORWARDED = ("anthropic-version", "anthropic-beta")
"""Client headers forwarded upstream (and to a count)."""

# Statuses a proxy or load balancer answers when it gave up waiting: the provider may
# still have run (and billed) the request, so its bounds are kept (DESIGN §5: timeout
# after dispatch). Other error statuses are the provider's own definite refusals.
_AMBIGUOUS_STATUS = frozenset({408, 502, 504, 524})


def _error_outcome(status: int) -> Outcome:
    if status in _AMBIGUOUS_STATUS:
        return Outcome(kind=OutcomeKind.UNCERTAIN,
                       detail=f"upstream answered HTTP {status}: it may have run the request")
    return Outcome(kind=OutcomeKind.COMPLETE, usage=Usage(),
                   detail=f"upstream answered HTTP {status}")


def _failure_outcome(attempt: Attempt, exc: BaseException, detail: str) -> Outcome:
    dispatched = attempt.dispatched and getattr(exc, "dispatched", True)
    return Outcome(kind=OutcomeKind.UNCERTAIN if dispatched else OutcomeKind.CANCELLED,
                   detail=detail)


class Exchange:
    """What the error renderer needs to know of one request, as far as it got."""

    __slots__ = ("call", "principal", "request_id", "trace")

    def __init__(self) -> None:
        self.request_id: str | None = None
        self.principal: Principal | None = None
        self.call: Call | None = None
        self.trace: RequestTrace = OFF
        """The request's spans (``gateway.telemetry``), handed to its Call."""


async def serve(gw: Gateway, ex: Exchange, endpoint: Endpoint, protocol: Protocol_,
                headers: dict[str, str], receive: Any) -> Reply:
    """One generation request, stage by stage (module docstring): prepare, then
    :func:`dispatch`."""
    ex.call = call = await prepare(gw, ex, endpoint, protocol, headers, receive)
    call.trace.begin(call)  # the root span's name and who asked (tracing off: nothing)
    routing = call.model.routing
    session = (session_of(call.model.name, headers, call.client_doc)
               if routing is not None and routing.affinity else None)
    return await dispatch(call, session=session)


async def dispatch(call: Call, *, session: Session | None = None) -> Reply:
    """Route (``gateway.routing``: the deployments in the order to try), then bound →
    admit → dispatch → settle, one attempt per deployment in that order, until one
    answers."""
    await call.gw.router.recall(call.model, session)  # the shared profile's pin, if any
    tier = await _tier(call)  # past a soft budget: the model's cheaper tier, if it can
    plan = call.gw.router.plan(call.model, call.deployments, session=session, tier=tier)
    await plan.settle_affinity()  # preferAffinity: a bounded wait for the pinned one
    routing = call.model.routing
    if routing is not None and routing.dedupe and not call.stream:
        return await deduplicated(call, plan, max_waiters=routing.dedupe_waiters,
                                  run=_in_order)
    return await _in_order(call, plan)


async def _tier(call: Call) -> TierChoice:
    """The tier of a request of a model with ``routing.soft_tier`` (``gateway.routing``'s
    ``choose_tier``: its caller's soft budgets as the store holds them, a few hundred ms
    old at most); standard for every other model, without a read."""
    routing = call.model.routing
    if routing is None or routing.soft_tier is None:
        return STANDARD
    charges = soft_charges(call.principal, call.gw.policy.snapshot(), now=datetime.now(UTC))
    return await choose_tier(call.gw.router.soft, call.gw.governance, call.model, charges,
                             input_tokens=call.bounds.input_tokens,
                             tools=bool(call.client_doc.get("tools")))


async def _in_order(call: Call, plan: Plan[Provider]) -> Reply:
    """Each deployment in the plan's order until one answers (the module docstring)."""
    failed: list[str] = []  # the deployments tried before, for a fallback's refusal
    for index, (deployment, provider) in enumerate(plan.order):
        attempt = Attempt(call=call, deployment=deployment, provider=provider, index=index,
                          after=tuple(failed), tier=plan.tier_of(deployment),
                          tier_kept=plan.tier.kept)
        await attempt.bound()  # this deployment's cap and counts
        await attempt.admit()  # one call to the Governor: a permit, or the refusal
        # Dispatch; the permit is settled once, as the answer ends (or here, on a failure).
        reply = await _dispatch(attempt, last=index == len(plan.order) - 1)
        if reply is not None:
            if reply.status < 300:
                plan.served(deployment)
            return reply
        call = attempt.call  # settled; the next deployment starts from this value
        failed.append(call.gw.router.name_of(call.model, deployment))
    raise UpstreamUnavailable("no deployment could be tried")  # pragma: no cover


async def prepare(gw: Gateway, ex: Exchange, endpoint: Endpoint, protocol: Protocol_,
                  headers: dict[str, str], receive: Any) -> Call:
    """Authenticate → read the body within ``server.max_body_bytes`` → parse → route →
    bound: the request as one value."""
    ex.request_id = rid = new_request_id()
    key_hash = await credential_key_hash(gw, headers)
    ex.principal = principal = await gw.resolver.to_admit(key_hash)
    server = gw.settings.server
    body = await receive_body(receive, headers, server.max_body_bytes)
    doc = parse_json(body)
    target = route(gw, principal, doc, protocol)
    # Screen: guardrails act on every text field before anything is bounded or admitted
    # (a block is refused here: nothing admitted, nothing charged; docs/guardrails.md).
    guardrails, profiles = tenant_guardrails(  # with the published GuardrailPolicy
        gw.settings.guardrails, gw.policy.snapshot(), principal.team.name,
        principal.team.guardrails)
    with ex.trace.span("apply_guardrail", when=guardrails.enabled or bool(profiles)) as span:
        doc, body, guard = await guard_request(
            guardrails, principal.team_id, profiles, doc, body,
            endpoint=endpoint, request_id=rid, registry=gw.metrics.registry)
        span.set({"gen_ai.guardrail.findings": guard.findings if guard is not None else 0})
    out = output_bound(doc, endpoint, target.model, ceiling=server.max_output_tokens)
    bounds = Bounds(input_tokens=input_bound(body, doc, target.model), output_tokens=out,
                    price=target.model.price, input_classes=input_classes(doc),
                    choices=choices(doc, endpoint))
    return Call(gw=gw, principal=principal, endpoint=endpoint, model=target.model, doc=doc,
                body=body, stream=wants_stream(doc, endpoint), bounds=bounds,
                client_headers={h: headers[h] for h in _FORWARDED if h in headers},
                deployments=target.deployments, request_id=rid, key_hash=key_hash,
                client=client_tool(headers.get("user-agent")), guard=guard, trace=ex.trace)


async def _dispatch(attempt: Attempt, *, last: bool) -> Reply | None:
    """Dispatch an admitted attempt; its permit is settled whatever goes wrong."""
    try:
        return await _attempt(attempt, last=last)
    except BaseException as exc:
        # Whatever went wrong (a bug, a shutdown cancelling the handler), the permit
        # must not stay pending when this attempt can still say what happened.
        if not attempt.settled:
            with anyio.CancelScope(shield=True):
                await attempt.finish(_failure_outcome(
                    attempt, exc, f"attempt aborted: {type(exc).__name__}"), status=500)
        raise


async def _attempt(attempt: Attempt, *, last: bool) -> Reply | None:
    """One deployment: the response to return, or None to fall back to the next one."""
    call, provider = attempt.call, attempt.provider
    router = call.gw.router
    body, strip = upstream_body(call.body, call.doc, attempt.deployment, call.endpoint,
                                stream=call.stream)
    await attempt.dispatching()
    try:
        upstream = await provider.send(call.endpoint, body, headers=attempt.upstream_headers)
    except UpstreamFailure as exc:
        router.failed(call.model, attempt.deployment, retry_after_s=None, why=str(exc))
        await attempt.finish(_failure_outcome(attempt, exc, str(exc)), status=502)
        if last:
            raise UpstreamUnavailable(f"upstream {provider.name} failed: {exc}") from exc
        return None
    metrics = call.gw.metrics
    metrics.child(metrics.upstream_latency, provider.name).observe(upstream.elapsed_s)
    upstream.chunks = metrics.first_byte(upstream.chunks, provider.name, upstream.elapsed_s)
    if call.trace.recording:  # the answering model and finish reasons, read as they pass
        upstream.chunks = call.trace.answer(attempt.index, upstream.chunks)
    if upstream.status in RETRYABLE_STATUS:
        wait = retry_after_s(upstream.headers)
        router.failed(call.model, attempt.deployment, why=f"HTTP {upstream.status}",
                      retry_after_s=exhausted_s(upstream.ratelimit) if wait is None else wait)
    else:
        router.succeeded(call.model, attempt.deployment, ratelimit=upstream.ratelimit)
    if upstream.status in RETRYABLE_STATUS and not last:
        await _discard(upstream)
        await attempt.finish(_error_outcome(upstream.status), status=upstream.status)
        return None
    if call.stream and upstream.status == 200:
        return _stream_response(attempt, upstream, strip)
    try:
        return await _json_response(attempt, upstream)
    except UpstreamFailure as exc:
        router.failed(call.model, attempt.deployment, retry_after_s=None, why=str(exc))
        await attempt.finish(Outcome(kind=OutcomeKind.UNCERTAIN, detail=str(exc)), status=502)
        if last:
            raise UpstreamUnavailable(f"upstream {provider.name} failed: {exc}") from exc
        return None


async def _discard(upstream: UpstreamResponse) -> None:
    try:
        await upstream.read()
    except UpstreamFailure:
        await upstream.close()


async def _json_response(attempt: Attempt, upstream: UpstreamResponse) -> Reply:
    data = await upstream.read()
    if 200 <= upstream.status < 300:
        try:
            outcome = outcome_for(extract_json(attempt.call.endpoint, data))
        except InvalidUsage as exc:
            await attempt.finish(Outcome(kind=OutcomeKind.INVALID, detail=str(exc)),
                                 status=502)
            raise InvalidUpstreamUsage(f"the upstream reported invalid usage ({exc}); "
                                       "nothing was charged and the account is frozen "
                                       "for review") from exc
    else:
        outcome = _error_outcome(upstream.status)
    settlement = await attempt.finish(outcome, status=upstream.status)
    headers = {**upstream.headers, **attempt.headers()}
    guard = attempt.call.guard
    if guard is not None and 200 <= upstream.status < 300:
        data = guard.answer_json(data)  # masks, blocks (settled), restores pseudonyms
    if settlement is not None:
        if settlement.kind is OutcomeKind.COMPLETE:
            headers["x-inferplane-cost-micro-usd"] = str(settlement.usd_committed)
        headers["x-inferplane-committed-micro-usd"] = str(settlement.usd_committed)
        headers["x-inferplane-liability-micro-usd"] = str(settlement.usd_liability)
    return Reply(upstream.status, headers, upstream.content_type, data)


def _stream_response(attempt: Attempt, upstream: UpstreamResponse, strip: bool) -> Reply:
    meter = StreamMeter(attempt.call.endpoint, strip_usage_chunk=strip)
    hangup = Hangup()
    relay = _relay(attempt, upstream, meter, hangup)
    headers = {**upstream.headers, **attempt.headers(), "cache-control": "no-cache",
               # Reverse proxies must not buffer the stream.
               "x-accel-buffering": "no"}
    return Reply(200, headers, "text/event-stream", stream=relay, hangup=hangup,
                 after=partial(_after_stream, relay, attempt, upstream, hangup))


async def _after_stream(relay: AsyncGenerator[bytes, None], attempt: Attempt,
                        upstream: UpstreamResponse, hangup: Hangup) -> None:
    """Runs once the response is over, however it ended.

    Closing the relay runs its ``finally`` if it is parked at a ``yield``. A relay that
    never started (the client left before the first byte was asked for) has no
    ``finally`` to run, so its attempt is settled here: dispatched, nothing observed.
    """
    await relay.aclose()
    if not attempt.settled:
        await upstream.close()
        detail = (CUT_AT_SHUTDOWN if hangup.why == CUT_AT_SHUTDOWN
                  else "client disconnected before the stream started")
        await attempt.finish(Outcome(kind=OutcomeKind.UNCERTAIN, detail=detail), status=200)


class _Resumable:
    """Upstream chunks whose pending read survives the relay's cancellation.

    A client disconnect cancels the relay while it awaits the upstream's next chunk; a
    plain ``async for`` would deliver that cancellation into the upstream stream and end
    it. Here the read runs in its own task behind ``asyncio.shield``, so the drain after a
    disconnect (``server.drain_on_disconnect_s`` > 0) picks up exactly where the relay
    stopped. Only used when draining is on: it costs a task per chunk.
    """

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks
        self._next: asyncio.Future[bytes] | None = None

    def __aiter__(self) -> _Resumable:
        return self

    async def __anext__(self) -> bytes:
        if self._next is None:
            self._next = asyncio.ensure_future(self._chunks.__anext__())
        pending = self._next
        chunk = await asyncio.shield(pending)  # cancelled: the read goes on, kept
        self._next = None
        return chunk


async def _relay(attempt: Attempt, upstream: UpstreamResponse, meter: StreamMeter,
                 hangup: Hangup) -> AsyncGenerator[bytes, None]:
    ended, cut, blocked = False, "", ""
    guard = stream_filter(attempt.call.guard, attempt.call.endpoint)
    draining = attempt.call.gw.settings.server.drain_on_disconnect_s > 0
    chunks: AsyncIterator[bytes] = _Resumable(upstream.chunks) if draining else upstream.chunks
    try:
        try:
            async for chunk in chunks:
                out = meter.feed(chunk)
                out = guard.feed(out) if guard is not None else out
                if hangup.why:
                    return  # gone while this chunk was buffered (module docstring)
                if meter.complete and not attempt.settled:
                    # Settled (journal, audit line, the store asked) before the client sees
                    # the end marker: a crash right after the client got its whole answer
                    # cannot leave it without its exact settlement and its audit line.
                    with anyio.CancelScope(shield=True):
                        await attempt.finish(_stream_outcome(meter, True, ""), status=200)
                if out:
                    yield out
            tail = meter.flush()
            tail = guard.finish(tail) if guard is not None else tail
            if tail:
                yield tail
            ended = True
        except UpstreamFailure as exc:
            cut = f"upstream stream cut: {exc}"
            call = attempt.call  # a cut is a failure its deployment's health counts
            call.gw.router.failed(call.model, attempt.deployment, retry_after_s=None, why=cut)
        except GuardrailBlocked as exc:  # cut like an upstream cut: what arrived commits
            cut = blocked = f"{exc.message} (request {attempt.call.request_id})"
        except asyncio.CancelledError:
            # Not the client's (its watcher says so first): the server's drain deadline.
            hangup.why = hangup.why or CUT_AT_SHUTDOWN
            raise
        if not cut and not meter.complete:
            cut = "upstream stream ended without its end marker"
        if cut:
            # Tell the client in its protocol's words: its SDK raises instead of taking
            # a truncated answer for a complete one.
            # The provider and transport detail go to the log and the audit, not the client.
            log.warning("request %s: %s", attempt.call.request_id, cut)
            yield stream_error_event(
                attempt.call.endpoint, blocked or "upstream stream cut; the answer is "
                f"incomplete (request {attempt.call.request_id})")
    finally:
        with anyio.CancelScope(shield=True):
            try:
                if not ended and not cut and draining and hangup.why != CUT_AT_SHUTDOWN:
                    await _drain(attempt, chunks, meter)
            finally:  # also when the server's deadline cancels the drain
                await upstream.close()
                await attempt.finish(_stream_outcome(meter, ended, cut, why=hangup.why,
                                                     call=attempt.call), status=200)


async def _drain(attempt: Attempt, chunks: AsyncIterator[bytes], meter: StreamMeter) -> None:
    """The client left mid-stream: read the upstream on, discarded, for up to
    ``server.drain_on_disconnect_s`` so its usage can still be settled exactly. The
    deadline is checked between chunks too: the timeout's cancellation reaches this
    task only while it waits on a read that is not done yet."""
    limit = attempt.call.gw.settings.server.drain_on_disconnect_s
    deadline = asyncio.get_running_loop().time() + limit
    with anyio.move_on_after(limit):
        try:
            async for chunk in chunks:
                meter.feed(chunk)
                if meter.complete or asyncio.get_running_loop().time() >= deadline:
                    break
        except UpstreamFailure:
            return


def _stream_outcome(meter: StreamMeter, ended: bool, cut: str, *,
                    why: str | None = None, call: Call | None = None) -> Outcome:
    try:
        usage = meter.usage()
        if meter.complete and usage is not None:
            return outcome_for(usage)
        if usage is None and call is not None and meter.content_events:
            # Generation started, so the prompt was processed: its exactly counted text
            # commits (an OpenAI stream reports usage only at its end).
            usage = proven_input(call.endpoint, call.doc, call.model)
        if cut:
            detail = cut
        elif ended:
            detail = "stream ended without usage"
        elif why == CUT_AT_SHUTDOWN:
            detail = CUT_AT_SHUTDOWN
        else:
            detail = f"{CLIENT_LEFT} mid-stream"
        # What arrived before the end commits; the rest of the bound is liability.
        return Outcome(kind=OutcomeKind.UNCERTAIN, usage=usage, detail=detail,
                       output_floor=meter.content_events)
    except InvalidUsage as exc:
        return Outcome(kind=OutcomeKind.INVALID, detail=str(exc))
