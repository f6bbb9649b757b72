"""Coalescing admissions: many concurrent ``admit`` calls, few database round trips.

On one hot team every admission waits for the same row locks, so one gateway can admit
at most one request per lock hold (DESIGN §4). ``inferplane_admit_v2`` decides a whole
batch in one transaction, so the way past that bound is to send the requests that are
waiting anyway as one batch. :class:`Coalescer` does it without adding latency: up to
``max_in_flight`` calls go to the database at once; requests arriving while all of
them are busy queue, and the next free slot sends everything queued as one call.

A caller cancelled while its batch is in the database may still be granted a permit:
that permit is settled CANCELLED (a full refund) in the background, so it never stays
pending and binding.

:class:`SettlementCoalescer` does the same for settlements, which on a hot team hold the
same row locks as admissions: the settlements waiting anyway are taken in one
transaction (docs/batching.md says why that is exact).

A stalled database must not hold callers any longer than the pool would: a caller that no
call has taken within ``max_wait_s`` (the pool's timeout) leaves the queue and gets
GovernanceUnavailable, having sent nothing, and the call in flight ends at the database's
statement timeout. A batch that fails with GovernanceUnavailable fails every settlement
in it with that error (the journal replay takes them later) instead of trying each alone,
which would wait the stall out once per settlement.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from gateway.errors import GovernanceUnavailable
from gateway.governance._model import (
    AdmissionRequest,
    Permit,
    Refusal,
    Settlement,
    SettleResult,
)

log = logging.getLogger("mayu.governance")

Decision = Permit | Refusal
Send = Callable[[list[AdmissionRequest]], Awaitable[list[Decision]]]
Refund = Callable[[Permit], Awaitable[object]]
AdmissionWaiter = tuple[list[AdmissionRequest], asyncio.Future[list[Decision]]]
T = TypeVar("T")
W = TypeVar("W", bound=tuple[Any, ...])


async def _turn(queue: list[Any], future: asyncio.Future[T], max_wait_s: float | None) -> T:
    """``future``'s result, the last item of its waiter in ``queue``. If no call has taken
    the waiter from ``queue`` within ``max_wait_s``, it leaves the queue (nothing of it was
    sent) and fails with GovernanceUnavailable; once taken, the call's own bounds apply."""
    if max_wait_s is None:
        return await future
    expiry = asyncio.get_running_loop().call_later(max_wait_s, _expire, queue, future,
                                                   max_wait_s)
    try:
        return await future
    finally:
        expiry.cancel()


def _expire(queue: list[Any], future: asyncio.Future[Any], max_wait_s: float) -> None:
    if _unqueue(queue, future) and not future.done():
        future.set_exception(GovernanceUnavailable(
            f"governance database: no call free to carry it within {max_wait_s:g}s "
            "(database.pool_timeout_s)"))


def _unqueue(queue: list[Any], future: asyncio.Future[Any]) -> bool:
    """Take the waiter of ``future`` out of ``queue``; False if a call already took it."""
    for i, item in enumerate(queue):
        if item[-1] is future:
            del queue[i]
            return True
    return False


class _Lane(Generic[W]):
    """At most ``max_in_flight`` calls at once: a waiter (its future last) arriving while
    every call is busy queues, and the next free call takes the queue (:meth:`_call`)."""

    def __init__(self, *, max_in_flight: int, max_batch: int,
                 max_wait_s: float | None) -> None:
        self._max_in_flight, self._max_batch = max_in_flight, max_batch
        self._max_wait_s = max_wait_s
        self._in_flight = 0
        self._queue: list[W] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def _wake(self) -> None:
        """Start a drain if a call slot is free (else a running drain takes the queue)."""
        if self._in_flight < self._max_in_flight:
            self._in_flight += 1
            self._spawn(self._drain())

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _waiting(self) -> bool:
        return bool(self._queue)

    async def _drain(self) -> None:
        """Make calls, one after the other, until nothing is waiting."""
        try:
            while self._waiting():
                await self._call()
        finally:
            self._in_flight -= 1

    async def _call(self) -> None:
        """One call with (the first ``max_batch`` of) what is waiting."""
        raise NotImplementedError


class Coalescer(_Lane[AdmissionWaiter]):
    """Admissions: at most ``max_in_flight`` calls at once, the rest queued and sent
    together by the next free call; a caller waits at most ``max_wait_s`` (None: no
    limit) for a call to take it."""

    def __init__(self, send: Send, refund: Refund, *, max_in_flight: int,
                 max_batch: int = 64, max_wait_s: float | None = None) -> None:
        super().__init__(max_in_flight=max_in_flight, max_batch=max_batch,
                         max_wait_s=max_wait_s)
        self._send, self._refund = send, refund

    async def admit(self, requests: list[AdmissionRequest]) -> list[Decision]:
        future: asyncio.Future[list[Decision]] = asyncio.get_running_loop().create_future()
        self._queue.append((requests, future))
        self._wake()
        try:
            return await _turn(self._queue, future, self._max_wait_s)
        except asyncio.CancelledError:
            if _unqueue(self._queue, future):
                raise  # cancelled before any call took it: nothing was sent
            # Cancelled after the batch resolved but before this caller resumed: the
            # result is already set, so _one_batch could not see the cancellation.
            if future.done() and not future.cancelled() and future.exception() is None:
                for d in future.result():
                    if isinstance(d, Permit):
                        self._spawn(self._give_back(d))
            raise

    async def _call(self) -> None:
        await self._one_batch(self._take_admissions())

    def _take_admissions(self) -> list[AdmissionWaiter]:
        batch, size = [], 0
        while self._queue and size < self._max_batch:
            item = self._queue.pop(0)
            batch.append(item)
            size += len(item[0])
        return batch

    async def _one_batch(self, batch: list[AdmissionWaiter]) -> None:
        flat = [r for reqs, _ in batch for r in reqs]
        try:
            decisions = await self._send(flat)
        except Exception as exc:  # every caller of the batch sees the store's error
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        self._deliver(batch, decisions)

    def _deliver(self, batch: list[AdmissionWaiter], decisions: list[Decision]) -> None:
        """Each caller its own decisions; a cancelled caller's permits given back."""
        i = 0
        for reqs, future in batch:
            mine = decisions[i:i + len(reqs)]
            i += len(reqs)
            if future.done():  # the caller was cancelled: give back what it was granted
                for d in mine:
                    if isinstance(d, Permit):
                        self._spawn(self._give_back(d))
            else:
                future.set_result(mine)

    async def _give_back(self, permit: Permit) -> None:
        try:
            await self._refund(permit)
        except Exception:
            log.exception("permit %s of a cancelled admission could not be refunded; it "
                          "stays pending", permit.id)


SettleItem = tuple[str, Settlement]
SettleOne = Callable[[str, Settlement], Awaitable[SettleResult]]
SettleMany = Callable[[list[SettleItem]], Awaitable[list[SettleResult | Exception]]]
SettleWaiter = tuple[str, Settlement, asyncio.Future[SettleResult]]
Merged = Callable[[list[SettleItem], list[AdmissionRequest]],
                  Awaitable[tuple[list[SettleResult | Exception], list[Decision]]]]


class SettlementCoalescer(_Lane[SettleWaiter]):
    """Settlements the same way: at most ``max_in_flight`` settlement calls at once; the
    settlements arriving meanwhile go together as one transaction (``many``), each with
    its own result. A lone settlement goes at once, alone (``one``). If the batch's
    transaction fails as a whole, each of its settlements is tried again alone, so one
    settlement's error never becomes another's."""

    def __init__(self, one: SettleOne, many: SettleMany, *, max_in_flight: int,
                 max_batch: int = 64, max_wait_s: float | None = None) -> None:
        super().__init__(max_in_flight=max_in_flight, max_batch=max_batch,
                         max_wait_s=max_wait_s)
        self._one, self._many = one, many

    async def settle(self, permit_id: str, settlement: Settlement) -> SettleResult:
        future: asyncio.Future[SettleResult] = asyncio.get_running_loop().create_future()
        self._queue.append((permit_id, settlement, future))
        self._wake()
        return await _turn(self._queue, future, self._max_wait_s)

    async def _call(self) -> None:
        batch = self._queue[:self._max_batch]
        del self._queue[:self._max_batch]
        await settle_batch(self._one, self._many, batch)


async def settle_batch(one: SettleOne, many: SettleMany, batch: list[SettleWaiter]) -> None:
    """One batch of settlements: alone if it is one, else ``many``; if that transaction
    fails as a whole, each is tried again alone, unless the store is unavailable."""
    if len(batch) == 1:
        await _alone(one, *batch[0])
        return
    try:
        results = await many([(p, s) for p, s, _ in batch])
    except Exception as exc:
        await _retry_alone(one, batch, exc)
        return
    _deliver_settled(batch, results)


async def _retry_alone(one: SettleOne, batch: list[SettleWaiter], exc: Exception) -> None:
    """After a batch failed as a whole: each settlement alone, so one settlement's error
    never becomes another's; but with the store unavailable (the database stalled or
    gone) each fails with that error at once, for the journal replay to take later."""
    if isinstance(exc, GovernanceUnavailable):
        for _, _, future in batch:
            if not future.done():
                future.set_exception(exc)
        return
    for item in batch:
        await _alone(one, *item)


def _deliver_settled(batch: list[SettleWaiter],
                     results: list[SettleResult | Exception]) -> None:
    for (_, _, future), result in zip(batch, results, strict=True):
        if future.done():
            continue
        if isinstance(result, Exception):
            future.set_exception(result)
        else:
            future.set_result(result)


async def _alone(one: SettleOne, permit_id: str, settlement: Settlement,
                 future: asyncio.Future[SettleResult]) -> None:
    try:
        result = await one(permit_id, settlement)
    except Exception as exc:
        if not future.done():
            future.set_exception(exc)
        return
    if not future.done():
        future.set_result(result)


class MergedCoalescer(Coalescer):
    """Admissions and settlements in ONE lane: at most ``max_in_flight`` calls at once,
    and what waits meanwhile goes as one transaction, settlements first, then admissions
    (``merged``; docs/batching.md, "Merged batches"): on a hot team that is one commit per
    admit + settle pair instead of two. A batch of one kind only takes that kind's path
    (``send`` for admissions, ``one``/``many`` for settlements). If a merged transaction
    fails as a whole, its admissions fail with its error (nothing was dispatched) and its
    settlements are tried again alone (unless the store is unavailable)."""

    def __init__(self, send: Send, refund: Refund, one: SettleOne, many: SettleMany,
                 merged: Merged, *, max_in_flight: int, max_batch: int = 64,
                 max_wait_s: float | None = None) -> None:
        super().__init__(send, refund, max_in_flight=max_in_flight, max_batch=max_batch,
                         max_wait_s=max_wait_s)
        self._one, self._many, self._merged = one, many, merged
        self._settlements: list[SettleWaiter] = []

    async def settle(self, permit_id: str, settlement: Settlement) -> SettleResult:
        future: asyncio.Future[SettleResult] = asyncio.get_running_loop().create_future()
        self._settlements.append((permit_id, settlement, future))
        self._wake()
        return await _turn(self._settlements, future, self._max_wait_s)

    def _waiting(self) -> bool:
        return bool(self._queue or self._settlements)

    async def _call(self) -> None:
        admissions = self._take_admissions()
        settlements = self._settlements[:self._max_batch]
        del self._settlements[:self._max_batch]
        if admissions and settlements:
            await self._merged_batch(settlements, admissions)
        elif admissions:
            await self._one_batch(admissions)
        else:
            await settle_batch(self._one, self._many, settlements)

    async def _merged_batch(self, settlements: list[SettleWaiter],
                            admissions: list[AdmissionWaiter]) -> None:
        flat = [r for reqs, _ in admissions for r in reqs]
        try:
            settled, decisions = await self._merged([(p, s) for p, s, _ in settlements], flat)
        except Exception as exc:
            for _, future in admissions:
                if not future.done():
                    future.set_exception(exc)
            await _retry_alone(self._one, settlements, exc)
            return
        _deliver_settled(settlements, settled)
        self._deliver(admissions, decisions)
