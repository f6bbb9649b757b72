"""The shared-profile governance store: admission and settlement in Postgres (ADR-046).

Python plans (:func:`gateway.governance.plan_charges`, :func:`settlement_for`); the
database executes each step as ONE statement calling a PL/pgSQL function of
``sql/governance.sql`` (named in ``sql/queries.sql``), so an admission or a settlement is
one round trip and one transaction, under READ COMMITTED with explicit row locks taken in
one sorted order. Semantics match the local store (:mod:`gateway.governance._local`):
same refusal codes, figures and wording (:mod:`._refusal`), same settlement fingerprint,
same commit validation.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import msgspec

import sql
from gateway.db import (
    HeldConnections,
    Pool,
    connection,
    fetch_all,
    fetch_one,
    maybe_committed,
)
from gateway.errors import GovernanceUnavailable, SettlementConflict, UnknownPermit
from gateway.governance._coalesce import Coalescer, MergedCoalescer, SettlementCoalescer
from gateway.governance._model import (
    AdmissionRequest,
    Charge,
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
    RefusalFigures,
    Settlement,
    SettleResult,
    StoredFigures,
    UsageRow,
    born_figures,
)
from gateway.governance._ops import (
    FrozenCounter,
    LogFilter,
    PermitInfo,
    SummaryFigures,
    summary_params,
)
from gateway.governance._plan import (
    check_commit_values,
    refill,
    settlement_fingerprint,
    validate_request,
)
from gateway.governance._refusal import refusal
from gateway.governance._settle import settlement_for
from gateway.pricing import InvalidUsage

log = logging.getLogger("mayu.governance")

REFUND_PAUSES_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
"""Pauses between the attempts to refund the permit of a cancelled admission while the
store is unavailable (stalled past its timeouts, restarting): no journal holds that
permit, so giving up leaves it pending and binding until an operator resolves it."""

SWEEP_PAUSES_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Pauses between the attempts to find the permits of admissions whose answer was lost
with their connection (then every 60 s until the store closes)."""
SWEEP_MARGIN_S = 600.0
"""How far before the failure such a permit may have been created (database time): far
more than a call's bound (pool timeout + statement timeout)."""


def _refusal(raw: dict[str, Any]) -> Refusal:
    """The refusal the database reported, worded as the local store words it."""
    counter, code = raw.get("counter") or "", raw["reason"]
    # The database reports the code and the figures; the status comes from the table.
    figures = None
    if "limit" in raw:
        figures = RefusalFigures(
            limit=raw.get("limit"), committed=int(raw.get("committed") or 0),
            liability=int(raw.get("liability") or 0), reserved=int(raw.get("reserved") or 0),
            leased=int(raw.get("leased") or 0), amount=int(raw.get("amount") or 0),
            window=raw.get("window"), dimension=raw.get("dimension") or "usd")
    retry = raw.get("retry_after")
    return refusal(code, counter, figures=figures,
                   retry_after=None if retry is None else int(retry))


def _settlement_body(settlement: Settlement) -> dict[str, Any]:
    body: dict[str, Any] = msgspec.to_builtins(settlement)
    body.pop("usage", None)
    body.pop("facts", None)
    body["fingerprint"] = settlement_fingerprint(settlement)
    return body


def _facts_json(items: list[tuple[str, Settlement]]) -> str:
    """The request log's facts of these settlements (``permit_facts`` rows): those
    with facts or reported usage; the settle call writes them
    (``inferplane_write_facts_v2``)."""
    rows = []
    for permit_id, s in items:
        if s.facts is None and s.usage is None:
            continue
        row: dict[str, Any] = {"permit_id": permit_id}
        if s.facts is not None:
            row.update(msgspec.to_builtins(s.facts))
        if s.usage is not None:
            row.update(msgspec.to_builtins(s.usage))
        rows.append(row)
    return _encode(rows).decode()


_encode = msgspec.json.Encoder().encode


def _settlement_json(settlement: Settlement) -> str:
    return _encode(_settlement_body(settlement)).decode()


def _settlements_json(items: list[tuple[str, Settlement]]) -> str:
    """A settlement batch's input: each settlement with its permit id."""
    bodies = []
    for permit_id, settlement in items:
        body = _settlement_body(settlement)
        body["permit_id"] = permit_id
        bodies.append(body)
    return _encode(bodies).decode()


class Tally:
    """What the store's hot calls carried: requests and settlements, and the calls (each
    one transaction) they went in; logged at close, read by the benches."""

    def __init__(self) -> None:
        self.admission_calls = self.admitted = 0
        self.settlement_calls = self.settled = 0
        self.merged_calls = 0
        """Calls that carried both (counted in both figures above as well)."""

    def line(self) -> str:
        merged = f" ({self.merged_calls} of them merged)" if self.merged_calls else ""
        return (f"{self.admitted} admissions in {self.admission_calls} calls, "
                f"{self.settled} settlements in {self.settlement_calls} calls{merged}")


class PostgresGovernanceStore:
    """:class:`gateway.governance.GovernanceStore` on the shared Postgres database.

    ``coalesce``: at most this many admission calls in flight; admissions arriving while
    they are all busy are sent together as one batch (:mod:`._coalesce`). 0 (default):
    every ``admit`` is its own call. ``settle_coalesce``: the same for settlements, a
    batch being one call and one transaction.

    ``merge`` (with both coalescings on): admissions and settlements share one lane of
    ``coalesce`` calls in flight, and those waiting at once go as ONE transaction,
    settlements first (``settle_admit``, :class:`MergedCoalescer`).

    Bounded when the database stalls, coalescing or not: a call waits at most the pool's
    ``timeout`` for a connection, and a coalesced admission or settlement as long for a
    call to carry it; the call itself ends at the sessions' statement timeout
    (:func:`gateway.db.open_pool`). Either way it fails with GovernanceUnavailable.
    """

    def __init__(self, pool: Pool, *, coalesce: int = 0, settle_coalesce: int = 0,
                 merge: bool = False) -> None:
        self._pool = pool
        # The admission and settlement calls keep their connections between calls, so
        # they stay on warm backends (gateway.db.HeldConnections): as many as the calls
        # in flight at once with coalescing, two (one of each) without.
        self._held = HeldConnections(
            pool, keep=coalesce + settle_coalesce if coalesce + settle_coalesce else 2)
        self.tally = Tally()
        # Admissions whose caller was cancelled, and the refunds of their permits.
        self._background: set[asyncio.Future[Any]] = set()
        # Sweeps for the permits of admissions whose answer was lost, with their ids.
        self._sweeps: dict[asyncio.Future[int], list[str]] = {}
        # Waiting for a coalesced call stands for waiting for a connection: same bound.
        wait_s = pool.timeout
        self._coalescer = (Coalescer(self._admit_now, self._refund, max_in_flight=coalesce,
                                     max_wait_s=wait_s)
                           if coalesce > 0 else None)
        self._settler: SettlementCoalescer | MergedCoalescer | None = (
            SettlementCoalescer(self._settle_one, self._settle_many,
                                max_in_flight=settle_coalesce, max_wait_s=wait_s)
            if settle_coalesce > 0 else None)
        if merge and coalesce > 0 and settle_coalesce > 0:
            merged = MergedCoalescer(self._admit_now, self._refund, self._settle_one,
                                     self._settle_many, self._settle_admit,
                                     max_in_flight=coalesce, max_wait_s=wait_s)
            self._coalescer = self._settler = merged

    async def admit(self, requests: list[AdmissionRequest]) -> list[Permit | Refusal]:
        if not requests:
            return []
        for req in requests:
            validate_request(req)
        if self._coalescer is not None:
            return await self._coalescer.admit(requests)
        # Shielded: if the caller is cancelled (client gone) while the database decides,
        # the admission still completes and any permit it granted is refunded, instead
        # of staying pending and binding the budget with nobody to settle it.
        task = asyncio.ensure_future(self._admit_now(requests))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self._background.add(task)
            # Refund first, so _background never looks empty between the two.
            task.add_done_callback(self._refund_orphans)
            task.add_done_callback(self._background.discard)
            raise

    def _refund_orphans(self, task: asyncio.Future[list[Permit | Refusal]]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        for decision in task.result():
            if isinstance(decision, Permit):
                refund = asyncio.ensure_future(self._refund(decision))
                self._background.add(refund)
                refund.add_done_callback(self._background.discard)

    async def _refund(self, permit: Permit) -> SettleResult:
        cancel = Outcome(kind=OutcomeKind.CANCELLED, detail="admission caller cancelled")
        settlement = settlement_for(permit.request, cancel)
        for pause in REFUND_PAUSES_S:
            try:
                return await self.settle(permit.id, settlement)
            except GovernanceUnavailable as exc:
                log.warning("refund of permit %s (admission caller cancelled) failed, "
                            "retrying in %gs: %s", permit.id, pause, exc)
                await asyncio.sleep(pause)
        return await self.settle(permit.id, settlement)

    async def _admit_now(self, requests: list[AdmissionRequest]) -> list[Permit | Refusal]:
        self.tally.admission_calls += 1
        self.tally.admitted += len(requests)
        payload = msgspec.json.encode(requests).decode()
        try:
            async with self._held.connection() as conn:
                row = await fetch_one(conn, sql.queries[self._admit_query(len(requests))],
                                      {"requests": payload})
        except GovernanceUnavailable as exc:
            self._sweep_if_unsure(exc, requests)
            raise
        assert row is not None
        return _decisions(requests, row["results"])

    # -- admissions whose answer was lost ------------------------------------------------

    def _sweep_if_unsure(self, exc: GovernanceUnavailable,
                         requests: Iterable[AdmissionRequest]) -> None:
        """After an admission call failed: if it may have committed (the connection was
        lost with its answer, as in a failover), refund what it granted once the store
        answers again.

        Its callers were answered 503 and nothing of theirs was dispatched, so a permit
        it granted is an orphan that would bind the budget forever: found by its
        request id (an attempt's own id: no other admission of it follows a failed
        one) and settled cancelled, exactly once (settlement is idempotent by permit
        id). PostgreSQL documents that a commit whose acknowledgement was lost may
        still have committed; docs/failover.md."""
        if not maybe_committed(exc):
            return
        ids = [r.request_id for r in requests]
        log.warning("admission of %d request(s) may have committed before its "
                    "connection was lost (%s); their permits, if any, are refunded once "
                    "the database answers", len(ids), exc)
        task = asyncio.ensure_future(self._sweep(ids, time.monotonic()))
        self._sweeps[task] = ids
        task.add_done_callback(lambda t: self._sweeps.pop(t, None))

    async def _sweep(self, request_ids: list[str], failed_at: float) -> int:
        """Refund the pending permits of ``request_ids`` (see :meth:`_sweep_if_unsure`);
        how many there were."""
        for pause in itertools.chain(SWEEP_PAUSES_S, itertools.repeat(60.0)):
            await asyncio.sleep(pause)
            within = time.monotonic() - failed_at + SWEEP_MARGIN_S
            try:
                async with connection(self._pool) as conn:
                    rows = await fetch_all(conn, sql.queries["unsettled_of_requests"],
                                           {"request_ids": request_ids,
                                            "within_s": within})
                permits = [p for r in rows if (p := await self.get_permit(r["id"]))]
            except GovernanceUnavailable as exc:
                log.info("sweep of %d unanswered admission(s): %s; retrying",
                         len(request_ids), exc)
                continue
            for permit in permits:
                log.warning("permit %s was granted but its answer was lost with the "
                            "connection: refunded (cancelled, never dispatched)", permit.id)
                await self._refund(permit)
            return len(permits)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _admit_query(n: int) -> str:
        # One request alone goes to the lone call, which costs less for one; from two on,
        # the set-based batch wins.
        return "admit_batch" if n > 1 else "admit_one"

    async def _settle_admit(self, items: list[tuple[str, Settlement]],
                            requests: list[AdmissionRequest]
                            ) -> tuple[list[SettleResult | Exception], list[Permit | Refusal]]:
        """Settlements, then admissions, in one transaction and one round trip."""
        t = self.tally
        t.merged_calls += 1
        t.admission_calls += 1
        t.admitted += len(requests)
        t.settlement_calls += 1
        t.settled += len(items)
        params = {"items": _settlements_json(items), "facts": _facts_json(items),
                  "requests": msgspec.json.encode(requests).decode()}
        try:
            async with self._held.connection() as conn:
                row = await fetch_one(conn, sql.queries["settle_admit"], params)
        except GovernanceUnavailable as exc:
            self._sweep_if_unsure(exc, requests)
            raise
        assert row is not None
        return (_settle_results(items, row["results"]["settled"]),
                _decisions(requests, row["results"]["admitted"]))

    async def settle(self, permit_id: str, settlement: Settlement) -> SettleResult:
        _check(permit_id, settlement)
        if self._settler is None:
            return await self._settle_one(permit_id, settlement)
        return await self._settler.settle(permit_id, settlement)

    async def _settle_one(self, permit_id: str, settlement: Settlement) -> SettleResult:
        self.tally.settlement_calls += 1
        self.tally.settled += 1
        return await self._settle("settle_one", permit_id, settlement)

    async def _settle_many(self, items: list[tuple[str, Settlement]]
                           ) -> list[SettleResult | Exception]:
        """One call, one transaction: each answer what the settlement alone would get."""
        self.tally.settlement_calls += 1
        self.tally.settled += len(items)
        async with self._held.connection() as conn:
            row = await fetch_one(conn, sql.queries["settle_batch"],
                                  {"items": _settlements_json(items),
                                   "facts": _facts_json(items)})
        assert row is not None
        return _settle_results(items, row["results"])

    async def resolve(self, permit_id: str, settlement: Settlement) -> SettleResult:
        """Replace an uncertain or tokens-known permit's liability by an exact figure; a
        pending permit is settled with it (``inferplane_resolve_v2``)."""
        _check(permit_id, settlement)
        return await self._settle("resolve", permit_id, settlement)

    async def _settle(self, query: str, permit_id: str,
                      settlement: Settlement) -> SettleResult:
        """One call (the caller has run :func:`_check`)."""
        params = {"permit_id": permit_id, "settlement": _settlement_json(settlement),
                  "facts": _facts_json([(permit_id, settlement)])}
        async with self._held.connection() as conn:
            row = await fetch_one(conn, sql.queries[query], params)
        assert row is not None
        return _settle_result(permit_id, settlement, row["result"])

    async def current_generation(self) -> int:
        async with connection(self._pool) as conn:
            row = await fetch_one(conn, sql.queries["current_generation"])
        assert row is not None
        return int(row["generation"])

    async def usage(self, *, day: str, month: str, key_id: str | None = None,
                    team_id: str | None = None) -> list[UsageRow]:
        params = {"day": day, "month": month, "key_id": key_id, "team_id": team_id}
        async with connection(self._pool) as conn:
            rows = await fetch_all(conn, sql.queries["usage"], params)
        return [UsageRow(**r) for r in rows]

    async def figures(self, charges: list[Charge]) -> dict[str, StoredFigures]:
        async with connection(self._pool) as conn:
            rows = await fetch_all(conn, sql.queries["figures"],
                                   {"keys": [c.counter for c in charges]})
            # Nothing charged yet: the clock alone.
            clock = rows[0] if rows else await fetch_one(
                conn, "SELECT inferplane_now_us_v1() AS now_us")
        assert clock is not None
        now: int = clock["now_us"]
        stored = {r["key"]: r for r in rows}
        out: dict[str, StoredFigures] = {}
        for c in charges:
            row = stored.get(c.counter)
            if row is None:
                out[c.counter] = born_figures(c, now)
                continue
            balance = None
            if c.kind == "bucket":
                balance = refill(row["balance"], c.limit or 0, now - row["updated_us"])
            out[c.counter] = StoredFigures(
                now_us=now, balance=balance, reserved=row["reserved"],
                committed=row["committed"], liability=row["liability"],
                leased=row["leased"], frozen=row["frozen"])
        return out

    async def counter(self, name: str) -> dict[str, Any] | None:
        """A counter or account row as stored (buckets not refilled), or None."""
        async with connection(self._pool) as conn:
            return await fetch_one(conn, sql.queries["counter"], {"key": name})

    async def note_tier(self, permit_id: str, tier: str) -> None:
        """The request log's tier of a permit (``routing.soft_tier``), once."""
        async with connection(self._pool) as conn:
            await conn.execute(sql.queries["insert_permit_tier"],
                               {"permit_id": permit_id, "tier": tier})

    async def unfreeze(self, name: str) -> bool:
        """Operator action: lift a freeze after investigating the invalid usage."""
        async with connection(self._pool) as conn:
            row = await fetch_one(conn, sql.queries["unfreeze"], {"key": name})
        return bool(row and row["lifted"])

    async def pending_permits(self) -> list[str]:
        """Ids of permits admitted and not yet settled (they keep binding the limits)."""
        async with connection(self._pool) as conn:
            rows = await fetch_all(conn, sql.queries["pending_permits"])
        return [r["id"] for r in rows]

    async def get_permit(self, permit_id: str) -> Permit | None:
        """The permit with its AdmissionRequest, rebuilt from ``permits`` and its
        ``permit_segments`` (pending or settled), or None if this database never granted
        it. The key and team revisions are not stored and come back as 0: they only
        matter to admission, never to settlement."""
        if not _is_uuid(permit_id):
            return None
        params = {"permit_id": permit_id}
        async with connection(self._pool) as conn, conn.transaction():
            row = await fetch_one(conn, sql.queries["get_permit"], params)
            segments = await fetch_all(conn, sql.queries["get_permit_segments"], params)
        return None if row is None else _rebuild(row, segments)

    async def permit_info(self, permit_id: str) -> PermitInfo | None:
        """One permit's operator view (status, bounds, settlement), or None if unknown."""
        if not _is_uuid(permit_id):
            return None
        found = await self._permits(permit_id=permit_id)
        return found[0] if found else None

    async def permits(self, *, pending_only: bool = False, older_than_s: int | None = None,
                      limit: int | None = None) -> list[PermitInfo]:
        """Permits oldest first (operators: what crashed gateways left pending)."""
        return await self._permits(pending_only=pending_only, older_than_s=older_than_s,
                                   limit=limit)

    async def _permits(self, *, pending_only: bool = False, older_than_s: int | None = None,
                       limit: int | None = None,
                       permit_id: str | None = None) -> list[PermitInfo]:
        params = {"pending_only": pending_only, "older_than_s": older_than_s,
                  "limit": limit, "permit_id": permit_id}
        async with connection(self._pool) as conn:
            rows = await fetch_all(conn, sql.queries["list_permits"], params)
        return [PermitInfo(**r) for r in rows]

    async def request_log(self, f: LogFilter, *, limit: int | None) -> list[PermitInfo]:
        """Permits newest first, filtered (the request log)."""
        if f.before is not None and not _is_uuid(f.before[1]):
            return []
        params = {"team_id": f.team_id, "key_id": f.key_id, "user": f.user,
                  "model": f.model, "status": f.status, "client": f.client,
                  "plane": f.plane, "since": f.since, "until": f.until,
                  "before_at": f.before[0] if f.before else None,
                  "before_id": f.before[1] if f.before else None, "limit": limit}
        async with connection(self._pool) as conn:
            # Unprepared: a cached generic plan, blind to which filters are set, reads
            # the whole time index for a filter that matches nothing recent (0.3-0.6 s
            # at 1M permits against ~2 ms planned for the filters given).
            rows = await fetch_all(conn, sql.queries["request_log"], params, prepare=False)
        return [PermitInfo(**r) for r in rows]

    async def last_used(self, key_ids: list[str]) -> dict[str, datetime]:
        """When each key was last admitted (its newest permit; absent: never, or every
        permit of it pruned)."""
        async with connection(self._pool) as conn:
            rows = await fetch_all(conn, sql.queries["keys_last_used"], {"keys": key_ids})
        return {r["key_id"]: r["last_used_at"] for r in rows if r["last_used_at"]}

    async def prune_permits(self, *, before: datetime, month: str, limit: int) -> int:
        """Request-log retention: delete up to ``limit`` settled permits admitted before
        ``before`` of a month before ``month`` (with their segments and facts); how many
        went (0 when another replica is pruning)."""
        async with connection(self._pool) as conn:
            row = await fetch_one(conn, sql.queries["prune_permits"],
                                  {"before": before, "month": month, "limit": limit})
        assert row is not None
        return int(row["pruned"])

    async def request_summary(self, f: LogFilter, *, groups: tuple[str, ...],
                              bucket: str) -> list[SummaryFigures]:
        """The request log summed per group and UTC period, by the database."""
        params = summary_params(f, groups, bucket) | {"since": f.since, "until": f.until}
        async with connection(self._pool) as conn:
            # Unprepared, as request_log: a generic plan sums a month 4x slower.
            rows = await fetch_all(conn, sql.queries["request_summary"], params,
                                   prepare=False)
        return [SummaryFigures(**r) for r in rows]

    async def frozen(self) -> list[FrozenCounter]:
        """Frozen money windows and accounts, with the invalid permit that froze each."""
        async with connection(self._pool) as conn:
            rows = await fetch_all(conn, sql.queries["frozen_counters"])
        return [FrozenCounter(**r) for r in rows]

    async def close(self) -> None:
        """Give the connections the hot calls keep back to the pool (the pool belongs to
        the app lifespan, which closes it afterwards)."""
        if self.tally.admission_calls or self.tally.settlement_calls:
            log.info("shared governance store: %s", self.tally.line())
        for task, ids in list(self._sweeps.items()):
            task.cancel()
            log.error("closing with %d admission(s) whose answer was lost unresolved: "
                      "a permit of request %s may stay pending (mayu permits list "
                      "--pending; mayu permits resolve)", len(ids), ", ".join(ids))
        await self._held.close()


def _check(permit_id: str, settlement: Settlement) -> None:
    """What the store refuses before asking the database (never part of a batch)."""
    if settlement.kind is not OutcomeKind.INVALID:
        check_commit_values(settlement.commits)
        check_commit_values(settlement.liabilities, what="liabilities")
    if not _is_uuid(permit_id):
        raise UnknownPermit(f"permit {permit_id!r} was never admitted by this store")


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _rebuild(row: dict[str, Any], segments: list[dict[str, Any]]) -> Permit:
    charges = tuple(Charge(counter=s["counter"], kind=s["kind"], dimension=s["dimension"],
                           amount=s["amount"], limit=s["limit"], window=s["window"],
                           rule_uid=s["rule_uid"], hard=s["hard"]) for s in segments)
    request = AdmissionRequest(
        request_id=row["request_id"], key_id=row["key_id"], key_revision=0,
        team_id=row["team_id"], team_revision=0, user=row["user_name"], model=row["model"],
        token_bound=row["token_bound"], usd_bound=row["usd_bound"],
        policy_generation=row["generation"], charges=charges, day=row["day"],
        month=row["month"])
    return Permit(id=row["id"], request=request)


def _decisions(requests: list[AdmissionRequest],
               answers: list[dict[str, Any]]) -> list[Permit | Refusal]:
    out: list[Permit | Refusal] = []
    for req, raw in zip(requests, answers, strict=True):
        if "permit_id" in raw:
            out.append(Permit(id=raw["permit_id"], request=req,
                              buckets={k: int(v) for k, v in
                                       (raw.get("buckets") or {}).items()}))
        else:
            out.append(_refusal(raw))
    return out


def _settle_results(items: list[tuple[str, Settlement]],
                    answers: list[dict[str, Any]]) -> list[SettleResult | Exception]:
    out: list[SettleResult | Exception] = []
    for (permit_id, settlement), raw in zip(items, answers, strict=True):
        try:
            out.append(_settle_result(permit_id, settlement, raw))
        except Exception as exc:  # this settlement's own answer (conflict, unknown)
            out.append(exc)
    return out


def _settle_result(permit_id: str, settlement: Settlement,
                   raw: dict[str, Any]) -> SettleResult:
    if raw.get("unknown"):
        raise UnknownPermit(f"permit {permit_id!r} was never admitted by this store")
    if raw.get("conflict"):
        raise SettlementConflict(
            f"permit {permit_id} was already settled as {raw['kind']}; a different "
            f"outcome ({settlement.kind}) is refused")
    if raw.get("bad_commits"):
        raise InvalidUsage(f"commits[{raw['bad_commits']!r}]: {raw['problem']}")
    return SettleResult(permit_id=permit_id, kind=OutcomeKind(raw["kind"]),
                        tokens_committed=int(raw["tokens_committed"]),
                        usd_committed=int(raw["usd_committed"]),
                        tokens_liability=int(raw["tokens_liability"]),
                        usd_liability=int(raw["usd_liability"]),
                        bound_exceeded=bool(raw["bound_exceeded"]),
                        replay=bool(raw["replay"]))
