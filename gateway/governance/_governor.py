"""The Governor: one owner for every permit's life (admit, dispatch, settle, replay).

The ingress asks it to admit a request, in one call with the request's facts (it plans
the counters, re-plans after a snapshot mismatch through the :class:`Keys` it was given,
tightens the bound after a shortfall: ``gateway.governance._admission``, with the worst
case of store decisions), tells it when a request is about to leave (journaled before the
first byte goes upstream), and hands it what the wire said in one call
(:meth:`Governor.settle_outcome`); the Governor computes the one :class:`Settlement`
(:func:`settlement_for`), journals it, and has the store take it.

The client's answer waits for the store's taking of its settlement at most
``settle_wait_s`` (default 0: not at all — the settlement is journaled first, then taken
while the answer leaves; docs/settlement.md, "Answer first"). A settlement the store
cannot take (database down, slow) is left to the replayer, which retries in journal order
until the store answers. :meth:`Governor.caught_up` waits for the settlements in flight,
so a usage report read after an answer includes it. At startup :meth:`Governor.start`
resolves what a crashed run left open in the journal before the gateway serves. At
shutdown :meth:`Governor.close` first lets the requests the server just cancelled settle
their own permits (they observed more than the bound), then settles every permit still
open (uncertain, with the reason) and flushes what it can. A permit has one settlement:
one the Governor already made is never followed by a second, different one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from gateway.errors import GovernanceUnavailable, InferplaneError, SettlementConflict
from gateway.governance._admission import (
    MAX_SNAPSHOT_RETRIES,
    MAX_SNAPSHOT_ROUNDS,
    MAX_TIGHTENINGS,
    Ask,
    Decided,
    Fit,
    Keys,
    fit,
    is_shortfall,
)
from gateway.governance._bounds import Bounds
from gateway.governance._journal import Journal, JournalEntry, recovered_outcome
from gateway.governance._model import (
    AdmissionRequest,
    GovernanceStore,
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
    RequestFacts,
    Settlement,
    SettleResult,
)
from gateway.governance._plan import build_request
from gateway.governance._settle import settlement_for
from gateway.keys import Principal
from gateway.pricing import InvalidUsage, ModelPrice

log = logging.getLogger("mayu.governance")

__all__ = ["MAX_SNAPSHOT_RETRIES", "MAX_SNAPSHOT_ROUNDS", "Governor", "Refused",
           "is_snapshot_mismatch"]

OWN_SETTLE_S = 2.0
"""At shutdown, how long the requests still running (cancelled by the server at its
drain deadline just before) have to settle their own permits before the Governor settles
the rest uncertain."""

REFUSAL_CATCH_UP_S = 1.0
"""How long a refused admission waits for its team's settlements in flight on this
replica before it is decided again (once); past it, the refusal stands."""

SettledHook = Callable[[Permit, Settlement, SettleResult | None, str | None, bool], None]
"""Called after each settlement attempt: (permit, settlement, result or None, error,
late: the attempt came from the replay, after the request's own answer)."""


class Refused(Exception):
    """Admission refused; the store's refusal (code, figures, wording) is attached, and
    (from :meth:`Governor.admit`) the principal and bounds the refused plan was made with.

    The ingress maps it to its protocol's error (one table, gateway/ingress)."""

    def __init__(self, refusal: Refusal, decided: Decided | None = None) -> None:
        super().__init__(refusal.reason)
        self.refusal = refusal
        self.decided = decided


def is_snapshot_mismatch(decision: object) -> bool:
    return isinstance(decision, Refusal) and decision.code == "snapshot_mismatch"


def _snapshot_of(request: AdmissionRequest) -> tuple[int, int, int]:
    """What a snapshot mismatch compares: the key and team revisions, the generation."""
    return request.key_revision, request.team_revision, request.policy_generation


class Governor:
    """Admits, journals, settles and replays permits against one governance store."""

    def __init__(self, store: GovernanceStore, *, keys: Keys | None = None,
                 journal: Journal | None = None, settle_wait_s: float = 0.0,
                 replay_interval_s: float = 1.0,
                 on_settled: SettledHook | None = None) -> None:
        self.store = store
        self._keys = keys
        self.journal = journal
        self._wait = settle_wait_s
        self._interval = replay_interval_s
        self.on_settled = on_settled
        self._open: dict[str, Permit] = {}
        self._settling = 0
        """settle() calls between taking a permit out of ``_open`` and handing its
        settlement on (the journal write may await an fsync)."""
        self._closed_out: dict[str, Settlement] = {}
        """Permits :meth:`close` settled while their requests were still running."""
        self._backlog: dict[str, tuple[Permit, Settlement]] = {}
        self._inflight: dict[asyncio.Task[Any], str] = {}  # settlement → its team id
        self._wake = asyncio.Event()
        self._replayer: asyncio.Task[None] | None = None
        self.admission_seconds: Callable[[float], None] | None = None
        self.settlement_seconds: Callable[[float], None] | None = None
        """Observes each store settlement call's duration (taken or failed)."""

    # -- admission -----------------------------------------------------------------------

    @property
    def keys(self) -> Keys:
        """What admission re-reads after a snapshot mismatch (given at construction)."""
        if self._keys is None:
            raise RuntimeError("Governor.admit needs the keys it was given at construction")
        return self._keys

    async def admit(self, ask: Ask) -> Decided:
        """Admit the request ``ask`` describes, re-planned after a snapshot mismatch and
        tightened after a shortfall (``gateway.governance._admission``: in that order, in
        at most MAX_DECISIONS store decisions). Returns how it was decided; a refusal is
        raised as :class:`Refused` carrying it. Raises GovernanceUnavailable when the
        store cannot decide, or the client's error when the key is no longer valid after
        a mismatch."""
        principal, bounds, fitted = ask.principal, ask.bounds, None
        request = self._plan(ask, principal, bounds)
        refused: AdmissionRequest | None = None
        decisions = rounds = stale = tightened = 0
        caught_up = False
        while True:
            decision = await self._decide(request)
            decisions += 1
            if isinstance(decision, Permit):
                break
            if is_snapshot_mismatch(decision):
                stale += refused is not None and _snapshot_of(request) == _snapshot_of(refused)
                if rounds == MAX_SNAPSHOT_ROUNDS or stale == MAX_SNAPSHOT_RETRIES:
                    break
                rounds += 1
                principal = await self._renew(ask, decision, request) or principal
                refused, request = request, self._plan(ask, principal, bounds)
                continue
            if not caught_up and await self._settled_meanwhile(request.team_id):
                caught_up = True  # decided again once this replica's answers landed
                continue
            if tightened == MAX_TIGHTENINGS or not is_shortfall(decision):
                break
            bounds, lower, tighter = await self._tighter(ask, bounds, decision, request)
            if not tighter:
                break
            tightened += 1
            fitted = lower or fitted
            request = self._plan(ask, principal, bounds)
        decided = Decided(permit=decision if isinstance(decision, Permit) else None,
                          principal=principal, bounds=bounds, fit=fitted,
                          decisions=decisions)
        if isinstance(decision, Refusal):
            raise Refused(decision, decided)
        self._opened(decision)
        return decided

    def _plan(self, ask: Ask, principal: Principal, bounds: Bounds) -> AdmissionRequest:
        return build_request(principal, self.keys.snapshot(), request_id=ask.request_id,
                             model=ask.model, token_bound=bounds.tokens,
                             usd_bound=bounds.usd, now=datetime.now(UTC), tpm=ask.tpm)

    async def _renew(self, ask: Ask, refusal: Refusal,
                     request: AdmissionRequest) -> Principal | None:
        return await self.keys.renew(refusal, key_hash=ask.key_hash, model=ask.model,
                                     used_generation=request.policy_generation)

    @staticmethod
    async def _tighter(ask: Ask, bounds: Bounds, refusal: Refusal, request: AdmissionRequest
                       ) -> tuple[Bounds, Fit | None, bool]:
        """After a shortfall: the input refined one step, else budget fit; the bounds
        to go on with, the fit, and whether either applied. A refinement that did not
        lower the input is kept all the same: it says why (a count that failed) or that
        a count was asked."""
        if ask.refinement is not None:
            refined = await ask.refinement.tighter(bounds)
            if refined is not None:
                if refined.input_tokens < bounds.input_tokens:
                    return refined, None, True
                bounds = refined
        lower = fit(bounds, refusal, request)
        if lower is None:
            return bounds, None, False
        return bounds.with_output(lower.per_choice * bounds.choices), lower, True

    async def admit_plan(self, request: AdmissionRequest) -> Permit:
        """Admit a request planned already, as is (no re-plan, no tighter bound: a
        snapshot mismatch is a refusal); decided again once if this replica's
        settlements of its team were in flight. For tools and tests that plan
        themselves; the request path uses :meth:`admit`."""
        decision = await self._decide(request)
        if (isinstance(decision, Refusal) and not is_snapshot_mismatch(decision)
                and await self._settled_meanwhile(request.team_id)):
            decision = await self._decide(request)
        if isinstance(decision, Refusal):
            raise Refused(decision)
        self._opened(decision)
        return decision

    def _opened(self, permit: Permit) -> None:
        self._open[permit.id] = permit
        if self.journal is not None:
            self.journal.admitted(permit)

    async def _decide(self, request: AdmissionRequest) -> Permit | Refusal:
        started = time.perf_counter()
        try:
            return (await self.store.admit([request]))[0]
        except InferplaneError:
            raise
        except Exception as exc:
            log.error("admission failed: %s", exc)
            raise GovernanceUnavailable("governance store unavailable") from exc
        finally:
            if self.admission_seconds is not None:
                self.admission_seconds(time.perf_counter() - started)

    async def dispatching(self, permit: Permit) -> None:
        """The request is about to leave the gateway (journaled first)."""
        if self.journal is not None:
            await self.journal.dispatching(permit.id)

    # -- settlement ----------------------------------------------------------------------

    def settlement(self, permit: Permit, outcome: Outcome,
                   price: ModelPrice | None = None) -> Settlement:
        """The one settlement of ``permit`` for what the wire said (settlement_for); for
        a permit :meth:`close` already settled, that one (so the request's audit line
        says what the store holds)."""
        done = self._closed_out.get(permit.id)
        if done is not None:
            return done
        return settlement_for(permit.request, outcome, price)

    async def settle_outcome(self, permit: Permit, outcome: Outcome, *,
                             price: ModelPrice | None, facts: RequestFacts | None = None
                             ) -> tuple[Settlement, SettleResult | None]:
        """Settle ``permit`` for what the wire said, in one call: the one settlement
        (:meth:`settlement`; usage that cannot be priced settles as invalid: nothing
        committed, the accounts frozen) with the request's ``facts`` for its log row,
        journaled and taken (:meth:`settle`). Returns it and the store's answer, if the
        answer waited for one."""
        try:
            settlement = self.settlement(permit, outcome, price)
        except InvalidUsage as exc:
            settlement = self.settlement(
                permit, Outcome(kind=OutcomeKind.INVALID, detail=str(exc)))
        if facts is not None:
            settlement = msgspec.structs.replace(settlement, facts=facts)
        return settlement, await self.settle(permit, settlement)

    async def settle(self, permit: Permit, settlement: Settlement) -> SettleResult | None:
        """Journal ``settlement`` and have the store take it; None when the caller goes
        on before the store answered (``settle_wait_s`` 0, or the store slower than it)
        or the settlement was left to the replayer (store unavailable).

        A permit :meth:`close` settled while its request was still finishing is not
        sent again: the store would refuse a second, different settlement."""
        if permit.id in self._closed_out:
            log.info("permit %s: settled at shutdown before its request reported (%s); "
                     "that report is not sent", permit.id, settlement.detail)
            return None
        return await self._settle(permit, settlement)

    async def _settle(self, permit: Permit, settlement: Settlement) -> SettleResult | None:
        # Out of the open set before the journal write, so close() cannot settle it too.
        self._open.pop(permit.id, None)
        if self.journal is not None:
            self._settling += 1
            try:
                await self.journal.observed(permit.id, settlement)
            finally:
                self._settling -= 1
        if self._backlog:  # the store is known to be down: keep the journal order
            self._queue(permit, settlement)
            return None
        task = asyncio.ensure_future(self._take(permit, settlement,
                                                after_answer=self._wait <= 0))
        self._inflight[task] = permit.request.team_id
        task.add_done_callback(self._inflight.pop)
        if self._wait <= 0:
            return None  # answer first: journaled, and taken while the answer leaves
        try:
            return await asyncio.wait_for(asyncio.shield(task), self._wait)
        except TimeoutError:
            return None  # the task goes on; it queues itself if the store fails

    async def _take(self, permit: Permit, settlement: Settlement, *,
                    queue_on_failure: bool = True,
                    after_answer: bool = False) -> SettleResult | None:
        if after_answer:
            # One loop turn first: the answer's bytes leave at the end of the turn its
            # handler wrote them in (gateway.server's Cork), and the local store settles
            # inline, which would otherwise run before them.
            await asyncio.sleep(0)
        started = time.perf_counter()
        try:
            result = await self.store.settle(permit.id, settlement)
        except GovernanceUnavailable as exc:
            self._timed(started)
            if queue_on_failure:
                self._queue(permit, settlement)
            self._report(permit, settlement, None, f"{type(exc).__name__}: {exc}",
                         not queue_on_failure)
            return None
        except SettlementConflict as exc:
            self._timed(started)
            # Settled another way first (an operator resolved a crashed run's permit, as
            # docs/settlement.md says): the store's settlement stands, this one is dropped.
            log.log(logging.INFO if not queue_on_failure else logging.WARNING,
                    "settlement of permit %s (%s) dropped: the store already holds "
                    "another (%s)", permit.id, settlement.kind, exc)
            self._done(permit.id)
            self._report(permit, settlement, None, f"{type(exc).__name__}: {exc}",
                         not queue_on_failure)
            return None
        except Exception as exc:
            self._timed(started)
            # A bug: replaying it would fail the same way forever.
            log.error("settlement of permit %s refused: %s: %s", permit.id,
                      type(exc).__name__, exc)
            self._done(permit.id)
            self._report(permit, settlement, None, f"{type(exc).__name__}: {exc}",
                         not queue_on_failure)
            return None
        self._timed(started)
        self._done(permit.id)
        self._report(permit, settlement, result, None, not queue_on_failure)
        return result

    def _timed(self, started: float) -> None:
        if self.settlement_seconds is not None:
            self.settlement_seconds(time.perf_counter() - started)

    def _report(self, permit: Permit, settlement: Settlement, result: SettleResult | None,
                error: str | None, late: bool) -> None:
        if self.on_settled is not None:
            try:
                self.on_settled(permit, settlement, result, error, late)
            except Exception:  # observability must never break settlement
                log.exception("settlement hook failed")

    def _done(self, permit_id: str) -> None:
        self._backlog.pop(permit_id, None)
        if self.journal is not None:
            self.journal.settled(permit_id)

    def _queue(self, permit: Permit, settlement: Settlement) -> None:
        if permit.id not in self._backlog:
            log.warning("settlement of permit %s left to the journal replay (store "
                        "unavailable)", permit.id)
        self._backlog[permit.id] = (permit, settlement)
        self._wake.set()

    async def caught_up(self, *, timeout_s: float = 1.0, team_id: str | None = None) -> bool:
        """Wait (at most ``timeout_s``) until the store answered every settlement in
        flight now (of ``team_id``'s permits, or all): taken, or left to the replayer.
        False if some were still in flight.

        A usage report read after an answer then counts that answer's settlement even
        though the answer did not wait for it (read your own writes on this replica)."""
        pending = self._pending(team_id)
        if not pending:
            return True
        _, still = await asyncio.wait(pending, timeout=timeout_s)
        return not still

    def _pending(self, team_id: str | None) -> list[asyncio.Task[Any]]:
        return [t for t, team in self._inflight.items()
                if not t.done() and team_id in (None, team)]

    async def _settled_meanwhile(self, team_id: str) -> bool:
        """True if settlements of ``team_id`` were in flight and have landed since."""
        return bool(self._pending(team_id)) and await self.caught_up(
            timeout_s=REFUSAL_CATCH_UP_S, team_id=team_id)

    @property
    def backlog(self) -> int:
        """Settlements waiting for the store (journaled, replayed in order)."""
        return len(self._backlog)

    @property
    def open_permits(self) -> int:
        return len(self._open)

    async def replay(self) -> int:
        """Try every queued settlement once, in order; stops at the first the store
        cannot take. Returns how many remain."""
        for permit_id in list(self._backlog):
            item = self._backlog.get(permit_id)
            if item is None:
                continue
            permit, settlement = item
            if await self._take(permit, settlement, queue_on_failure=False) is None \
                    and permit_id in self._backlog:
                break
        return len(self._backlog)

    async def _replay_forever(self) -> None:
        while True:
            await self._wake.wait()
            if await self.replay() == 0:
                self._wake.clear()
                continue
            await asyncio.sleep(self._interval)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Resolve what a previous run left open in the journal, then start replaying.

        Never dispatched → cancelled; outcome observed → settled as observed; dispatched
        without an outcome → uncertain (liability).
        """
        if self.journal is not None:
            left = self.journal.open()
            for entry in left.values():
                settlement = entry.settlement or self._recovered(entry)
                permit = Permit(id=entry.permit_id, request=entry.request)
                if entry.settlement is None:
                    await self.journal.observed(permit.id, settlement)
                self._backlog[permit.id] = (permit, settlement)
            if left:
                remaining = await self.replay()
                log.info("journal: %d permit(s) left open by the previous run resolved, "
                         "%d waiting for the store", len(left) - remaining, remaining)
            self.journal.start()
        self._replayer = asyncio.get_running_loop().create_task(self._replay_forever())
        if self._backlog:
            self._wake.set()

    def _recovered(self, entry: JournalEntry) -> Settlement:
        assert self.journal is not None
        return settlement_for(entry.request, recovered_outcome(entry, self.journal.boot))

    async def close(self, *, grace_s: float = 5.0, own_s: float = OWN_SETTLE_S) -> None:
        """Settle every permit still open, wait up to ``grace_s`` for in-flight
        settlements, flush the backlog once; whatever the store still cannot take stays
        in the journal for the next start.

        The requests still running go first, for up to ``own_s``: the server cancelled
        them at its drain deadline just before, and each settles what it observed (a cut
        stream: its relayed output), which the Governor cannot know. What is still open
        then is settled here, uncertain (the gateway stopped first) or cancelled if it
        was never dispatched, once: a request reporting later is not sent (settle)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + own_s
        while (self._open or self._settling) and loop.time() < until:
            await asyncio.sleep(0.01)
        for permit in list(self._open.values()):
            entry = self.journal.open_entries.get(permit.id) if self.journal else None
            dispatched = entry.dispatched if entry is not None else True
            outcome = Outcome(kind=OutcomeKind.UNCERTAIN if dispatched
                              else OutcomeKind.CANCELLED,
                              detail="gateway shut down before the outcome was observed")
            settlement = settlement_for(permit.request, outcome)
            self._closed_out[permit.id] = settlement
            await self._settle(permit, settlement)
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=grace_s)
        if self._backlog:
            await self.replay()
        if self._replayer is not None:
            self._replayer.cancel()
            await asyncio.gather(self._replayer, return_exceptions=True)
            self._replayer = None
        if self._backlog:
            log.warning("%d settlement(s) kept in the journal for the next start",
                        len(self._backlog))
        if self.journal is not None:
            await self.journal.close()
