"""One SQLite transaction for the local store's admissions and settlements pending at once.

Each admission and each settlement of the local profile is a short transaction on one
connection; about a third of its cost is ``BEGIN IMMEDIATE`` … ``COMMIT`` and the WAL
write, the same whatever the transaction holds. :class:`Batcher` shares that cost
between the operations that are pending at the same time, without delaying a lone one:

- **Idle** (nothing queued, nothing in a worker thread): an operation runs at once,
  alone, inline on the event loop. That opens a *window*: operations that
  arrive while it is open queue.
- **The window** is looked at after each loop turn (``call_soon``). While the loop has
  other work (the turn took longer than ``_IDLE_TURN_S``), the queue waits for more, at
  most ``max_turns`` turns, ``_MAX_WAIT_S`` or ``max_batch`` operations; when a turn
  finds the loop idle, or at a bound, the whole queue runs as one transaction and the
  window closes. Under load the operations of several turns share one commit (they
  would have waited for the loop anyway); on an idle loop a queued operation waits one
  short turn, and one request at a time never waits at all.
- **Busy file** (another process writes, or a worker thread holds the connection): the
  queue goes to a worker thread as one transaction; what arrives meanwhile queues for
  the next.

Why a batch is exact (docs/batching.md, "Why a batch is exact", argues the same for the
shared profile):

- It holds only operations that were pending at once: none has returned to its caller
  (a caller gets its answer after its batch's ``COMMIT``), so any order among them is a
  legal serial order; the batch fixes one, arrival order.
- Each operation runs on the running state: the rows every earlier operation of the
  batch wrote (and :class:`Batch`'s counters, which are those rows kept in memory until
  the batch writes them), under one write lock, at one instant (``Batch.now``).
- A refusal, an unknown permit or a conflict is an operation's *result*. An operation
  raises only before writing anything (decide, then write), so its exception is its
  own answer and the batch goes on; one that raised after writing (a bug) or any SQLite
  error fails the whole transaction, which rolls back: nothing of it happened. Then
  every admission of it fails (the ingress answers 503) and every settlement is tried
  again alone, so one settlement's error never becomes another's.
- A caller that is cancelled while queued does not take its operation back: it runs
  anyway (like a transaction already handed to a worker thread), and an admission's
  permits go to ``orphan`` (the store refunds them).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from msgspec.structs import replace

import sql
from gateway.errors import GovernanceUnavailable
from gateway.governance._counters import (
    CounterState,
    load_counter,
    read_counter,
    store_counters,
)
from gateway.governance._model import Charge
from gateway.localdb import Statements

_MAX_BATCH = 64
"""Operations per transaction at most (a longer queue takes several, one after another)."""
_MAX_TURNS = 8
"""Loop turns a queue waits at most for more operations while the loop is busy."""
_MAX_WAIT_S = 0.002
"""How long a queue waits at most since its window opened (bounds the latency added)."""
_IDLE_TURN_S = 20e-6
"""A loop turn shorter than this ran nothing but the batcher: the loop is idle, so the
queue goes at once (nothing else would come to join it soon)."""


_SQL = Statements(sql.local_governance)


class Batch:
    """What the operations of one transaction share: one instant (µs since the epoch) and
    the counter rows they move, read once and written once, at the end of the batch.

    Only a counter read from the file or written in this batch is kept: one that was
    never charged is born afresh from each charge (``load_counter``), exactly as when
    nothing of it was stored.
    """

    __slots__ = ("now", "writes", "_counters", "_dirty")

    def __init__(self, now: int) -> None:
        self.now = now
        self.writes = 0
        """How many counter writes the batch holds in memory (a change an operation made)."""
        self._counters: dict[str, CounterState] = {}
        self._dirty: set[str] = set()

    def load(self, conn: sqlite3.Connection, charge: Charge) -> CounterState:
        """The counter ``charge`` names, as every earlier operation of the batch left it."""
        state = self._counters.get(charge.counter)
        if state is not None:
            return state
        state = read_counter(conn, charge.counter)
        if state is None:  # never charged: born full/empty (read again there: rare)
            return load_counter(conn, charge, self.now)
        self._counters[charge.counter] = state
        return state

    def store(self, state: CounterState) -> None:
        self._counters[state.counter] = state
        self._dirty.add(state.counter)
        self.writes += 1

    def freeze(self, conn: sqlite3.Connection, counter: str, permit_id: str) -> None:
        """Freeze an existing counter for ``permit_id`` unless it is frozen already."""
        state = self._counters.get(counter)
        if state is None:
            _SQL["freeze_counter"].execute(conn, {"counter": counter, "permit_id": permit_id})
        elif state.frozen_by is None:
            self.store(replace(state, frozen_by=permit_id))

    def flush(self, conn: sqlite3.Connection) -> None:
        """Write every counter the batch changed (before its COMMIT)."""
        if not self._dirty:
            return
        store_counters(conn, [self._counters[name] for name in self._dirty])
        self._dirty.clear()


Op = Callable[[sqlite3.Connection, Batch], Any]
"""One admission or settlement: decides, then writes; raises only before writing."""
Outcome = tuple[bool, Any]
"""(True, the operation's result) or (False, the exception that is its answer)."""
Body = Callable[[sqlite3.Connection], list[Outcome]]
Inline = Callable[[Body, bool], tuple[bool, list[Outcome] | None]]
Threaded = Callable[[Body], Awaitable[list[Outcome]]]
Alone = Callable[[Body], Awaitable[list[Outcome]]]


@dataclass(slots=True)
class _Pending:
    op: Op
    future: asyncio.Future[Any]
    retry_alone: bool
    orphan: Callable[[Any], None] | None


class Batcher:
    """Runs :data:`Op` s in shared transactions (see the module docstring).

    ``inline(body, True)`` runs a transaction on the loop if that needs no wait
    (``(False, None)`` when the file or connection is busy), ``threaded(body)`` in a
    worker thread, ``alone(body)`` inline if possible else in a thread; ``now()`` is the
    batch's instant.
    """

    def __init__(self, *, inline: Inline, threaded: Threaded, alone: Alone,
                 now: Callable[[], int], max_batch: int = _MAX_BATCH,
                 max_turns: int = _MAX_TURNS) -> None:
        self._inline, self._threaded, self._alone = inline, threaded, alone
        self._now = now
        self._max_batch = max(1, max_batch)
        self._queue: list[_Pending] = []
        self._active = False  # a turn's window is open or a transaction is in a thread
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._max_turns = max_turns
        self._waited = 0
        self._turn_started = self._opened = 0.0
        self.transactions = 0
        """Transactions committed or attempted (with ``operations``: the mean batch)."""
        self.operations = 0

    async def run(self, op: Op, *, retry_alone: bool = False,
                  orphan: Callable[[Any], None] | None = None) -> Any:
        """``op``'s result once its transaction committed (or the exception that is its
        answer). ``retry_alone``: if a shared transaction fails, run ``op`` again alone;
        ``orphan``: receives the result of an operation whose caller was cancelled."""
        if not self._active and not self._queue:
            done, out = self._inline(self._body([op]), True)
            if done:
                assert out is not None
                if self._max_batch > 1:  # 1: no window, every operation goes at once
                    self._open()
                ok, value = out[0]
                if ok:
                    return value
                raise value
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(op, future, retry_alone, orphan))
        self._open()
        try:
            return await future
        except asyncio.CancelledError:
            # Cancelled after the result was set but before this caller resumed.
            if (orphan is not None and future.done() and not future.cancelled()
                    and future.exception() is None):
                orphan(future.result())
            raise

    async def idle(self) -> None:
        """Wait until every queued operation has been answered."""
        while self._active or self._queue:
            await self._idle.wait()

    # -- scheduling ----------------------------------------------------------------------

    def _open(self) -> None:
        if not self._active:
            self._active = True
            self._idle.clear()
            self._turn_started = self._opened = time.perf_counter()
            asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        """A loop turn ended: the queue waits while the loop has other work (within the
        bounds), then goes, one transaction per batch."""
        if not self._queue:
            self._close()
            return
        now = time.perf_counter()
        busy = now - self._turn_started > _IDLE_TURN_S
        self._turn_started = now
        if (busy and self._waited < self._max_turns and len(self._queue) < self._max_batch
                and now - self._opened < _MAX_WAIT_S):
            self._waited += 1
            asyncio.get_running_loop().call_soon(self._turn)
            return
        self._waited = 0
        while self._queue:
            items = self._take()
            try:
                done, out = self._inline(self._body([i.op for i in items]), True)
            except Exception as exc:
                retry = self._failed(items, exc)
                if retry:
                    self._spawn(self._retry(retry))
                    return
                continue
            if not done:  # busy: a worker thread takes this batch; the rest waits for it
                self._spawn(self._in_thread(items))
                return
            assert out is not None
            self._deliver(items, out)
        self._close()

    def _close(self) -> None:
        """Nothing queued: the next operation runs at once, alone."""
        self._active = False
        self._waited = 0
        self._idle.set()

    def _take(self) -> list[_Pending]:
        items = self._queue[:self._max_batch]
        del self._queue[:self._max_batch]
        return items

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _in_thread(self, items: list[_Pending]) -> None:
        try:
            try:
                out = await self._threaded(self._body([i.op for i in items]))
            except Exception as exc:
                await self._retry(self._failed(items, exc), then_turn=False)
            else:
                self._deliver(items, out)
        except BaseException:  # the loop is going away: nobody is left waiting
            for item in items:
                item.future.cancel()
            raise
        finally:
            asyncio.get_running_loop().call_soon(self._turn)

    async def _retry(self, items: list[_Pending], *, then_turn: bool = True) -> None:
        """Each of ``items`` alone, in its own transaction, after their batch failed."""
        try:
            for item in items:
                try:
                    out = await self._alone(self._body([item.op]))
                except Exception as exc:
                    out = [(False, exc)]
                self._deliver([item], out)
        finally:
            if then_turn:
                asyncio.get_running_loop().call_soon(self._turn)

    # -- one transaction -----------------------------------------------------------------

    def _body(self, ops: list[Op]) -> Body:
        def body(conn: sqlite3.Connection) -> list[Outcome]:
            self.transactions += 1
            self.operations += len(ops)
            batch = Batch(self._now())
            out: list[Outcome] = []
            for op in ops:
                before = (conn.total_changes, batch.writes)
                try:
                    out.append((True, op(conn, batch)))
                except sqlite3.Error:
                    raise
                except Exception as exc:
                    if (conn.total_changes, batch.writes) != before:
                        raise  # it wrote part of itself: only a rollback undoes that
                    out.append((False, exc))
            batch.flush(conn)
            return out
        return body

    def _failed(self, items: list[_Pending], exc: Exception) -> list[_Pending]:
        """The batch's transaction failed (rolled back): fail its admissions, and return
        its settlements, to be tried again alone. A lone operation gets the error."""
        if len(items) == 1:
            self._deliver(items, [(False, exc)])
            return []
        shared: Exception = exc
        if not isinstance(exc, sqlite3.Error):
            shared = GovernanceUnavailable("governance store: a shared transaction failed")
            shared.__cause__ = exc
        retry = [i for i in items if i.retry_alone]
        self._deliver([i for i in items if not i.retry_alone],
                      [(False, shared)] * (len(items) - len(retry)))
        return retry

    def _deliver(self, items: list[_Pending], out: list[Outcome]) -> None:
        for item, (ok, value) in zip(items, out, strict=True):
            future = item.future
            if future.done():  # the caller was cancelled meanwhile
                if ok and item.orphan is not None:
                    item.orphan(value)
            elif ok:
                future.set_result(value)
            else:
                future.set_exception(value)
