"""The dispatch stage for a model with ``routing.dedupe``: identical concurrent requests of
one team share one upstream call (``gateway.routing._dedupe``).

A waiter is admitted like any request (its own permit: budgets and rates count it) once
the leader's answer is in, and settles ``complete`` with zero usage, its detail naming
the leader: the first permit carries the cost, the others are counted, never charged. A
waiter refused at admission gets its refusal; one whose leader had no 2xx JSON answer to
share goes upstream itself. Streams are never shared.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.governance import Outcome, OutcomeKind
from gateway.ingress._attempt import Attempt
from gateway.ingress._call import Call
from gateway.ingress._reply import Reply
from gateway.pricing import Usage
from gateway.routing import Plan, Shared

Run = Callable[[Call, Plan[Any]], Awaitable[Reply]]


_SHARED = ("x-inferplane-tier", "x-inferplane-tier-kept")
"""The leader's own headers its waiters' answers carry too: which tier served it."""


async def deduplicated(call: Call, plan: Plan[Any], *, max_waiters: int, run: Run) -> Reply:
    """Lead (``run`` the request, then hand its answer to the waiters) or wait."""
    dedupe = call.gw.router.dedupe
    key = dedupe.key(call.principal.team_id, call.endpoint, call.client_body)
    flight = dedupe.follow(key, max_waiters=max_waiters)
    if flight is not None:
        shared = await asyncio.shield(flight.done)
        return await run(call, plan) if shared is None else await _waiter(call, plan, shared)
    flight = dedupe.lead(key, call.request_id)
    if flight is None:
        return await run(call, plan)
    answer: Shared | None = None
    try:
        reply = await run(call, plan)
        if 200 <= reply.status < 300 and reply.stream is None:
            answer = Shared(request_id=call.request_id, status=reply.status,
                            headers={k: v for k, v in reply.headers.items()
                                     if not k.startswith("x-inferplane-") or k in _SHARED},
                            content_type=reply.media_type, data=reply.body)
        return reply
    finally:
        dedupe.land(key, flight, answer)


async def _waiter(call: Call, plan: Plan[Any], shared: Shared) -> Reply:
    deployment, provider = plan.order[0]
    attempt = Attempt(call=call, deployment=deployment, provider=provider, index=0)
    await attempt.bound()
    await attempt.admit()
    await attempt.finish(Outcome(kind=OutcomeKind.COMPLETE, usage=Usage(),
                                 detail=f"deduplicated: answered by {shared.request_id}"),
                         status=shared.status)
    headers = {**shared.headers, **attempt.headers(),
               "x-inferplane-deduplicated": shared.request_id,
               "x-inferplane-cost-micro-usd": "0", "x-inferplane-committed-micro-usd": "0",
               "x-inferplane-liability-micro-usd": "0"}
    return Reply(shared.status, headers, shared.content_type, shared.data)
