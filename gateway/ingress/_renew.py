"""Keys as the request path reads them: resolved, cached where admission re-checks them,
and resolved afresh after a snapshot mismatch (:class:`Resolver`, the
:class:`gateway.governance.Keys` the Governor is given at construction).

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
import time
from datetime import UTC, datetime
from typing import Any

from gateway.errors import Forbidden, GovernanceUnavailable, InferplaneError, Unauthenticated
from gateway.governance import CounterKey, Refusal
from gateway.keys import KeyStore, Principal
from gateway.metrics import Metrics
from gateway.policy import PolicySnapshot, PolicySource

log = logging.getLogger("mayu.ingress")

_MAX_PRINCIPALS = 10_000


def mismatch_kind(refusal: Refusal) -> str:
    """``policy``, ``key`` or ``team``: what changed (the refusal's counter names it;
    anything that names neither a key nor a team is the policy)."""
    changed = CounterKey.parse(refusal.counter or "")
    return "policy" if changed is None else changed.owner


class Resolver:
    """The key store and policy source as admission reads them (one per gateway)."""

    def __init__(self, key_store: KeyStore, policy: PolicySource, metrics: Metrics, *,
                 principal_ttl_s: float = 0.0) -> None:
        self.key_store = key_store
        self.policy = policy
        self.metrics = metrics
        self.principal_ttl_s = principal_ttl_s
        """How long a resolved Principal plans admitted requests (0: resolved each time);
        only where admission re-checks it (the shared profile, :meth:`to_admit`)."""
        self.principals: dict[str, tuple[float, Principal]] = {}
        """Key hash → (when resolved, Principal), for :meth:`to_admit`."""
        self._reload: asyncio.Future[Any] | None = None
        """The on-demand policy reload in flight, shared by every request that needs it."""

    def snapshot(self) -> PolicySnapshot:
        return self.policy.snapshot()

    def remember(self, key_hash: str, principal: Principal) -> None:
        if len(self.principals) >= _MAX_PRINCIPALS:  # bounded: drop the oldest
            self.principals.pop(next(iter(self.principals)))
        self.principals.pop(key_hash, None)
        self.principals[key_hash] = (time.monotonic(), principal)

    async def resolve(self, key_hash: str) -> Principal:
        """The key's current Principal; 401 if unknown, revoked or expired."""
        try:
            principal = await self.key_store.resolve(key_hash)
        except Exception as exc:
            raise GovernanceUnavailable("key store unavailable") from exc
        if principal is None:
            self.principals.pop(key_hash, None)
            raise Unauthenticated()
        if self.principal_ttl_s > 0:
            self.remember(key_hash, principal)
        return principal

    async def to_admit(self, key_hash: str) -> Principal:
        """The Principal a request is planned with before its admission.

        In the shared profile admission itself re-checks, under its locks, that the key
        is not revoked or expired and that key and team are still at the revisions the
        Principal was read at (DESIGN §4); a stale Principal is refused as a snapshot
        mismatch and :meth:`renew` resolves the key afresh before the re-plan. So a
        Principal read at most ``principal_ttl_s`` ago is as good as a new one there, and
        saves the key lookup's round trip. Everywhere else (and for any route that is not
        admitted) the key is resolved every time.

        A team that names guardrail profiles is resolved every time too: its request is
        screened (and may be blocked) before admission, with the profiles the Principal
        holds, so a list cleared or relaxed meanwhile must not block with the old ones.
        (A list added to an unguarded team is caught by admission's revision check: the
        attempt refuses what was screened without it.)
        """
        if self.principal_ttl_s > 0:
            cached = self.principals.get(key_hash)
            if cached is not None and not cached[1].team.guardrails \
                    and time.monotonic() - cached[0] < self.principal_ttl_s:
                # A secret a rotation replaced works until its grace ends, not a TTL
                # longer: admission checks the key's revision, not which secret was shown.
                until = cached[1].secret_valid_until
                if until is None or datetime.now(UTC) < until:
                    return cached[1]
        return await self.resolve(key_hash)

    async def renew(self, refusal: Refusal, *, key_hash: str, model: str,
                    used_generation: int) -> Principal | None:
        """After ``refusal`` (a snapshot mismatch): refresh the snapshot if the policy
        changed, and re-resolve the key (None when there is no key hash to resolve).

        Raises 401 if the key is now revoked/expired/unknown, 403 if it may no longer use
        the model, 503 if the stores are unavailable.
        """
        kind = mismatch_kind(refusal)
        self.metrics.snapshot_retries.labels(kind).inc()
        if kind == "policy":
            await self.refresh_policy(used_generation)
        if not key_hash:
            return None
        principal = await self.resolve(key_hash)
        if not principal.may_use(model):
            raise Forbidden(f"this key may not use model {model!r}", param="model")
        return principal

    async def refresh_policy(self, used_generation: int) -> None:
        """Make the policy snapshot newer than ``used_generation`` if the source can reload.

        Joins a reload already in flight; if that one started before the publish that
        caused the mismatch (the snapshot is still the old one), starts one more.
        """
        reload = getattr(self.policy, "refresh", None)
        if reload is None:  # file/static sources: nothing newer to fetch on demand
            return
        for _ in range(2):
            if self.policy.snapshot().generation != used_generation:
                return
            task = self._reload
            joined = task is not None and not task.done()
            if task is None or task.done():
                task = self._reload = asyncio.ensure_future(reload())
            try:
                # Shielded: one caller going away must not cancel the reload the others
                # await.
                await asyncio.shield(task)
            except InferplaneError as exc:
                self.metrics.sync_errors.labels("refresh_failed").inc()
                log.warning("on-demand policy refresh failed: %s", exc.message)
                return
            except Exception as exc:
                self.metrics.sync_errors.labels("refresh_failed").inc()
                log.warning("on-demand policy refresh failed: %s: %s", type(exc).__name__,
                            exc)
                return
            if not joined:
                return
