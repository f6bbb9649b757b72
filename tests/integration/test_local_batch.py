"""The local store's shared transactions: admissions and settlements pending at once.

Real SQLite files in a temp dir. A batch forms when operations queue behind one that
just ran in the same loop turn (inline path), or while the connection is held (worker
thread path: the test holds the store's lock). Failures are real SQLite errors, raised
by triggers the tests install in the file.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable
from typing import Any

import pytest

from gateway.errors import SettlementConflict, UnknownPermit
from gateway.governance import (
    AdmissionRequest,
    LocalGovernanceStore,
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
)
from gateway.keys import TeamLimits
from tests.integration._local import Clock, admit_one, opened, principal, request
from tests.settling import exact, settlement

pytestmark = pytest.mark.integration

DAY_USD = "team:team_1:usd:day:2026-11-29"


@pytest.fixture
async def store(tmp_path, clock):
    async with opened(LocalGovernanceStore(str(tmp_path / "gov.db"), clock=clock)) as s:
        yield s


async def together(store: LocalGovernanceStore,
                   *calls: Awaitable[Any]) -> tuple[list[Any], int]:
    """Run ``calls`` pending at once (they all start in one loop turn; exceptions are
    returned, not raised): their answers and the transactions they took."""
    before = store._batcher.transactions
    results = await asyncio.gather(*calls, return_exceptions=True)
    return list(results), store._batcher.transactions - before


def _install_failure(store: LocalGovernanceStore, table: str, column: str,
                     value: str) -> None:
    """A trigger that makes the write of one row fail (a real SQLite error)."""
    conn = sqlite3.connect(store.path)
    conn.execute(f"CREATE TRIGGER fail_{table} BEFORE INSERT ON {table}"
                 f" WHEN NEW.{column} = '{value}'"
                 " BEGIN SELECT RAISE(ABORT, 'injected failure'); END")
    conn.commit()
    conn.close()


def _read(store: LocalGovernanceStore, sql: str, *args: object) -> list[tuple[Any, ...]]:
    """Read the file on a connection of its own: what is committed, nothing else."""
    conn = sqlite3.connect(store.path)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


async def test_a_lone_admission_runs_at_once_without_waiting(store):
    """With nothing in flight an admission is decided and committed within the call
    itself: the coroutine finishes on its first step, never suspending."""
    coro = store.admit([request(principal(TeamLimits(usd_micros_per_day=10_000)))])
    with pytest.raises(StopIteration) as done:
        coro.send(None)
    [permit] = done.value.value
    assert isinstance(permit, Permit)
    assert _read(store, "SELECT status FROM gov_permits WHERE id = ?", permit.id) == [
        ("pending",)]


async def test_admissions_pending_at_once_share_a_transaction_on_the_running_state(store):
    """Ten admissions of one turn: the first runs alone, the other nine share one
    transaction, each decided after the earlier ones (exactly limit // bound admitted,
    each refusal showing what the earlier members reserved)."""
    limit, bound = 100_000, 30_000
    p = principal(TeamLimits(usd_micros_per_day=limit))
    calls = [admit_one(store, request(p, usd=bound)) for _ in range(10)]
    results, transactions = await together(store, *calls)
    assert transactions == 2
    permits = [r for r in results if isinstance(r, Permit)]
    refusals = [r for r in results if isinstance(r, Refusal)]
    assert len(permits) == limit // bound and len(refusals) == 10 - limit // bound
    assert all(r.status == 402 and r.counter == DAY_USD for r in refusals)
    assert {r.figures.reserved for r in refusals} == {len(permits) * bound}
    state = await store.counter(DAY_USD)
    assert (state.reserved, state.committed) == (len(permits) * bound, 0)


async def test_refusals_and_bad_settlements_in_a_batch_are_their_own_answers(store):
    """In one transaction: a refused admission, an unknown permit, a conflicting replay,
    an exact replay, a settlement and a granted admission. Each gets its own answer; the
    refusal and the errors change nothing of the others."""
    p = principal(TeamLimits(usd_micros_per_day=100_000))
    first, second = request(p, usd=30_000), request(p, usd=30_000)
    [a] = await store.admit([first])
    [b] = await store.admit([second])
    s_a = settlement(first, exact(10, 5_000))
    await store.settle(a.id, s_a)
    await asyncio.sleep(0)  # the window of that turn closes

    opener = admit_one(store, request(p, usd=1))  # runs alone, opens the turn's window
    results, transactions = await together(
        store,
        opener,
        admit_one(store, request(p, usd=90_000)),               # refused: over the limit
        store.settle("no-such-permit", s_a),                    # unknown
        store.settle(a.id, settlement(first, exact(10, 6_000))),  # conflict
        store.settle(a.id, s_a),                                # exact replay
        store.settle(b.id, settlement(second, exact(10, 7_000))),
        admit_one(store, request(p, usd=20_000)))               # granted
    assert transactions == 2
    _, refused, unknown, conflict, replay, settled, granted = results
    assert isinstance(refused, Refusal) and refused.status == 402
    assert isinstance(unknown, UnknownPermit)
    assert isinstance(conflict, SettlementConflict)
    assert replay.replay and replay.usd_committed == 5_000
    assert not settled.replay and settled.usd_committed == 7_000
    assert isinstance(granted, Permit)
    state = await store.counter(DAY_USD)
    assert state.committed == 12_000 and state.reserved == 1 + 20_000


async def test_a_failing_transaction_fails_every_admission_and_retries_settlements_alone(
        store):
    """One admission's write fails (a real SQLite error): the shared transaction rolls
    back whole, so no admission of it is granted (each caller gets the store's error, the
    ingress's 503) and each settlement of it is committed by a transaction of its own."""
    p = principal(TeamLimits(usd_micros_per_day=1_000_000))
    reqs = [request(p, usd=10_000) for _ in range(2)]
    permits = [r[0] for r in await asyncio.gather(*(store.admit([q]) for q in reqs))]
    await asyncio.sleep(0)
    _install_failure(store, "gov_permits", "request_id", "poison")
    before = await store.counter(DAY_USD)

    results, transactions = await together(
        store,
        admit_one(store, request(p, usd=1)),                    # alone: granted
        admit_one(store, request(p, usd=100)),
        store.settle(permits[0].id, settlement(reqs[0], exact(5, 4_000))),
        admit_one(store, request(p, usd=200, request_id="poison")),
        store.settle(permits[1].id, settlement(reqs[1], exact(5, 3_000))),
        admit_one(store, request(p, usd=300)))
    opener, ok_before, settled_0, poisoned, settled_1, ok_after = results
    assert isinstance(opener, Permit)
    for failed in (ok_before, poisoned, ok_after):
        assert isinstance(failed, sqlite3.IntegrityError), failed
    assert settled_0.usd_committed == 4_000 and settled_1.usd_committed == 3_000
    assert transactions == 1 + 1 + 2  # opener, the failed batch, two settlements alone
    state = await store.counter(DAY_USD)
    assert state.committed == before.committed + 7_000
    assert state.reserved == before.reserved - 20_000 + 1  # only the opener's reservation
    assert _read(store, "SELECT count(*) FROM gov_permits") == [(3,)]


async def test_one_settlements_error_never_becomes_anothers(store):
    """A settlement whose write fails takes its batch down; retried alone, it fails with
    its own error and every other settlement of the batch commits."""
    p = principal(TeamLimits(usd_micros_per_day=1_000_000))
    reqs = [request(p, usd=10_000) for _ in range(4)]
    permits = [r[0] for r in await asyncio.gather(*(store.admit([q]) for q in reqs))]
    await asyncio.sleep(0)
    _install_failure(store, "gov_settlements", "permit_id", permits[2].id)

    calls = [store.settle(pm.id, settlement(q, exact(1, 1_000 + i)))
             for i, (pm, q) in enumerate(zip(permits, reqs, strict=True))]
    results, _ = await together(store, *calls)
    assert isinstance(results[2], sqlite3.IntegrityError)
    assert [r.usd_committed for i, r in enumerate(results) if i != 2] == [1_000, 1_001,
                                                                          1_003]
    assert await store.pending_permits() == [permits[2].id]
    state = await store.counter(DAY_USD)
    assert (state.committed, state.reserved) == (3_004, 10_000)


async def test_a_batch_in_a_worker_thread_is_one_transaction(store):
    """While the connection is held, admissions and settlements queue; they then go to a
    worker thread as one transaction, each answered on the running state."""
    p = principal(TeamLimits(usd_micros_per_day=100_000))
    first = request(p, usd=50_000)
    [a] = await store.admit([first])
    await asyncio.sleep(0)
    before = store._batcher.transactions
    store._lock.acquire()
    try:
        calls = [asyncio.ensure_future(store.settle(a.id, settlement(first, exact(1, 10))))]
        calls += [asyncio.ensure_future(admit_one(store, request(p, usd=40_000)))
                  for _ in range(4)]
        await asyncio.sleep(0.05)
        assert not any(c.done() for c in calls)
    finally:
        store._lock.release()
    settled, *admitted = await asyncio.gather(*calls)
    assert store._batcher.transactions - before == 1
    assert settled.usd_committed == 10
    # The settlement released 50,000 first (arrival order): two of 40,000 fit.
    assert [isinstance(r, Permit) for r in admitted] == [True, True, False, False]


async def test_every_answer_is_committed_before_its_caller_has_it(store):
    """Each caller of a shared transaction, on getting its permit or settlement, finds
    it in the file from a connection of its own."""
    p = principal(TeamLimits(usd_micros_per_day=10**9))

    async def admit_and_settle() -> None:
        req = request(p, usd=1_000)
        permit = await admit_one(store, req)
        assert isinstance(permit, Permit)
        assert _read(store, "SELECT status FROM gov_permits WHERE id = ?",
                     permit.id) == [("pending",)]
        await store.settle(permit.id, settlement(req, exact(1, 500)))
        assert _read(store, "SELECT usd_committed FROM gov_settlements WHERE permit_id = ?",
                     permit.id) == [(500,)]

    before = store._batcher.transactions
    await asyncio.gather(*(admit_and_settle() for _ in range(20)))
    assert store._batcher.transactions - before < 40  # some did share transactions


async def test_a_caller_cancelled_in_the_queue_is_refunded(store):
    """An admission cancelled while it waits for the end of the turn still runs (like
    one already handed to the database) and its permit is settled cancelled."""
    p = principal(TeamLimits(usd_micros_per_day=100_000))
    opener = asyncio.ensure_future(admit_one(store, request(p, usd=1)))
    queued = asyncio.ensure_future(admit_one(store, request(p, usd=60_000)))
    await asyncio.sleep(0)  # both ran their first step: the second is queued
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert isinstance(await opener, Permit)
    await store.drain()
    state = await store.counter(DAY_USD)
    assert (state.reserved, state.committed) == (1, 0)
    assert len(await store.pending_permits()) == 1


async def test_a_batchs_pending_permits_survive_reopen_and_keep_binding(tmp_path):
    """Permits granted by a shared transaction are in the file: after a restart they are
    still pending and still bind the limit."""
    path = str(tmp_path / "gov.db")
    p = principal(TeamLimits(usd_micros_per_day=100_000))
    store = LocalGovernanceStore(path, clock=Clock())
    await store.open()
    results = await asyncio.gather(*(admit_one(store, request(p, usd=30_000))
                                     for _ in range(5)))
    granted = [r.id for r in results if isinstance(r, Permit)]
    assert len(granted) == 3 and store._batcher.transactions == 2
    await store.close()

    reopened = LocalGovernanceStore(path, clock=Clock())
    await reopened.open()
    try:
        assert sorted(await reopened.pending_permits()) == sorted(granted)
        assert isinstance(await admit_one(reopened, request(p, usd=30_000)), Refusal)
        assert isinstance(await admit_one(reopened, request(p, usd=10_000)), Permit)
    finally:
        await reopened.close()


async def test_max_batch_bounds_each_transaction(tmp_path):
    """``max_batch`` caps the operations per transaction; 1 runs each alone."""
    p = principal(TeamLimits(usd_micros_per_day=10**9))
    for max_batch, expected in ((4, 1 + 3), (1, 10)):
        store = LocalGovernanceStore(str(tmp_path / f"gov{max_batch}.db"), clock=Clock(),
                                     max_batch=max_batch)
        await store.open()
        try:
            results = await asyncio.gather(*(admit_one(store, request(p))
                                             for _ in range(10)))
            assert all(isinstance(r, Permit) for r in results)
            assert store._batcher.transactions == expected
        finally:
            await store.close()


async def test_invalid_usage_in_a_batch_freezes_without_moving_counters(store):
    """An invalid settlement sharing a transaction with an admission freezes the money
    window; the admission decided after it in the same batch is refused as frozen."""
    p = principal(TeamLimits(usd_micros_per_day=100_000))
    req = request(p, usd=10_000)
    [permit] = await store.admit([req])
    await asyncio.sleep(0)
    invalid = settlement(req, Outcome(kind=OutcomeKind.INVALID, detail="negative"))
    results, transactions = await together(
        store,
        admit_one(store, request(p, usd=1)),
        store.settle(permit.id, invalid),
        admit_one(store, request(p, usd=1)))
    opener, frozen, refused = results
    assert isinstance(opener, Permit) and frozen.kind is OutcomeKind.INVALID
    assert isinstance(refused, Refusal) and refused.code == "account_frozen"
    assert transactions == 2
    state = await store.counter(DAY_USD)
    assert state.frozen_by == permit.id and state.committed == 0


async def test_admissions_of_a_failed_transaction_are_the_ingress_503(store):
    """Through the Governor (as the ingress admits), an admission that shared a failed
    transaction is GovernanceUnavailable (503, nothing dispatched), not another
    request's error."""
    from gateway.errors import GovernanceUnavailable
    from gateway.governance import Governor

    governor = Governor(store)
    p = principal(TeamLimits(usd_micros_per_day=1_000_000))
    _install_failure(store, "gov_permits", "request_id", "poison")

    def admit(req: AdmissionRequest) -> Awaitable[Permit]:
        return governor.admit_plan(req)

    results, transactions = await together(
        store, admit(request(p)), admit(request(p)),
        admit(request(p, request_id="poison")))
    opener, shared, poisoned = results
    assert isinstance(opener, Permit) and transactions == 2
    for failed in (shared, poisoned):
        assert isinstance(failed, GovernanceUnavailable) and failed.status == 503
    assert await store.pending_permits() == [opener.id]


async def test_an_operation_that_raises_after_writing_fails_its_whole_batch(store):
    """An operation that wrote and then raised (a bug, not a result) cannot be undone
    alone: its transaction rolls back whole and its batch-mates are told the store
    failed (GovernanceUnavailable), never handed its exception."""
    from gateway.errors import GovernanceUnavailable

    p = principal(TeamLimits(usd_micros_per_day=1_000_000))

    def broken(conn: sqlite3.Connection, batch: object) -> None:
        conn.execute("INSERT INTO gov_counters (counter, kind, dimension)"
                     " VALUES ('team:x:broken', 'window', 'usd')")
        raise ValueError("bug after a write")

    results, _ = await together(
        store, admit_one(store, request(p, usd=1)), admit_one(store, request(p, usd=2)),
        store._batcher.run(broken), admit_one(store, request(p, usd=3)))
    opener, before, bug, after = results
    assert isinstance(opener, Permit)
    for failed in (before, bug, after):
        assert isinstance(failed, GovernanceUnavailable), failed
    assert isinstance(bug.__cause__, ValueError)
    assert _read(store, "SELECT count(*) FROM gov_counters WHERE counter = 'team:x:broken'"
                 ) == [(0,)]
    assert (await store.counter(DAY_USD)).reserved == 1
