"""Re-planning a request whose admission was refused for a snapshot mismatch (the
Governor runs the loop, :func:`renew` is what it calls between rounds).

Admission refuses (503 ``snapshot_mismatch``) when the key or team revision, or the
policy generation, a request was planned with is no longer the store's. Nothing has been
dispatched at that point, so the gateway can do what a client would do, only sooner:
re-resolve the key (a revoked key is then a 401, an edited one brings its new limits),
make sure the policy snapshot is the published one, and plan again from scratch. A
request is therefore always admitted entirely under one snapshot.

The policy source is refreshed on demand, single-flighted per gateway: a publish makes
every in-flight request mismatch at once, and one reload serves them all.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.errors import Forbidden, InferplaneError
from gateway.governance import MAX_SNAPSHOT_RETRIES, CounterKey, Refusal, is_snapshot_mismatch
from gateway.ingress._context import Gateway
from gateway.ingress._prepare import resolve_principal
from gateway.keys import Principal

log = logging.getLogger("mayu.ingress")

__all__ = ["MAX_SNAPSHOT_RETRIES", "is_snapshot_mismatch", "mismatch_kind", "refresh_policy",
           "renew"]


def mismatch_kind(refusal: Refusal) -> str:
    """``policy``, ``key`` or ``team``: what changed (the refusal's counter names it;
    anything that names neither a key nor a team is the policy)."""
    changed = CounterKey.parse(refusal.counter or "")
    return "policy" if changed is None else changed.owner


async def refresh_policy(gw: Gateway, used_generation: int) -> None:
    """Make the policy snapshot newer than ``used_generation`` if the source can reload.

    Joins a reload already in flight; if that one started before the publish that caused
    the mismatch (the snapshot is still the old one), starts one more.
    """
    reload = getattr(gw.policy, "refresh", None)
    if reload is None:  # file/static sources: nothing newer to fetch on demand
        return
    for _ in range(2):
        if gw.policy.snapshot().generation != used_generation:
            return
        task = gw.policy_reload
        joined = task is not None and not task.done()
        if task is None or task.done():
            task = gw.policy_reload = asyncio.ensure_future(reload())
        try:
            # Shielded: one caller going away must not cancel the reload the others await.
            await asyncio.shield(task)
        except InferplaneError as exc:
            gw.metrics.sync_errors.labels("refresh_failed").inc()
            log.warning("on-demand policy refresh failed: %s", exc.message)
            return
        except Exception as exc:
            gw.metrics.sync_errors.labels("refresh_failed").inc()
            log.warning("on-demand policy refresh failed: %s: %s", type(exc).__name__, exc)
            return
        if not joined:
            return


async def renew(gw: Gateway, refusal: Refusal, *, key_hash: str, model: str,
                used_generation: int) -> Principal | None:
    """After ``refusal``: refresh the snapshot if the policy changed, and re-resolve the
    key (None when there is no key hash to resolve).

    Raises 401 if the key is now revoked/expired/unknown, 403 if it may no longer use
    the model, 503 if the stores are unavailable.
    """
    if mismatch_kind(refusal) == "policy":
        await refresh_policy(gw, used_generation)
    if not key_hash:
        return None
    principal = await resolve_principal(gw, key_hash)
    if not principal.may_use(model):
        raise Forbidden(f"this key may not use model {model!r}", param="model")
    return principal
