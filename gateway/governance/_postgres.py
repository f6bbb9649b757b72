"""The shared-profile governance store: admission and settlement in Postgres (ADR-046).

Python plans (:func:`gateway.governance.plan_charges`, :func:`commits_for`); the database
executes each step as ONE statement calling a versioned PL/pgSQL function
(``sql/admit_v1.sql``, ``sql/settle_v1.sql``), so an admission or a settlement is one
round trip and one transaction, under READ COMMITTED with explicit row locks taken in
one sorted order. Semantics match the local store (:mod:`gateway.governance._local`):
same refusal statuses, same outcome fingerprint, same commit validation.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import msgspec

import sql
from gateway.db import Pool, connection, fetch_all, fetch_one
from gateway.errors import SettlementConflict, UnknownPermit
from gateway.governance._coalesce import Coalescer
from gateway.governance._model import (
    AdmissionRequest,
    Charge,
    Outcome,
    OutcomeKind,
    Permit,
    Refusal,
    SettleResult,
    UsageRow,
)
from gateway.governance._ops import FrozenCounter, PermitInfo
from gateway.governance._plan import (
    check_commit_values,
    commits_for,
    known_amounts,
    outcome_fingerprint,
    validate_request,
)
from gateway.pricing import InvalidUsage


def _refusal(raw: dict[str, Any]) -> Refusal:
    """A refusal with the same wording as the local store's."""
    counter, code = raw.get("counter"), raw["reason"]
    reason = {
        "snapshot_mismatch": f"{counter}: changed since the request was authenticated or "
                             "routed (snapshot mismatch); retry",
        "rate_limited": f"{counter}: per minute limit exhausted",
        "account_frozen": f"{counter}: account is frozen after invalid usage was reported; "
                          "an operator must resolve it",
        "budget_exhausted": f"{counter}: spending limit would be exceeded",
        "token_quota_exhausted": f"{counter}: token quota would be exceeded",
    }.get(code, f"{counter}: {code}")
    retry = raw.get("retry_after")
    if raw["status"] == 503 and retry is None:
        retry = 1
    return Refusal(status=int(raw["status"]), reason=reason, counter=counter,
                   retry_after=None if retry is None else int(retry), code=code)


def _totals(outcome: Outcome) -> tuple[int | None, int | None]:
    """(tokens, µUSD) the permit commits; None = its bound, filled in by the database."""
    if outcome.kind is OutcomeKind.INVALID:
        return 0, 0  # invalid usage commits nothing; its money counters freeze instead
    return known_amounts(outcome)


class PostgresGovernanceStore:
    """:class:`gateway.governance.GovernanceStore` on the shared Postgres database.

    ``coalesce``: at most this many admission calls in flight; admissions arriving while
    they are all busy are sent together as one batch (:mod:`._coalesce`). 0 (default):
    every ``admit`` is its own call.
    """

    def __init__(self, pool: Pool, *, coalesce: int = 0) -> None:
        self._pool = pool
        # Admissions whose caller was cancelled, and the refunds of their permits.
        self._background: set[asyncio.Future[Any]] = set()
        self._coalescer = (Coalescer(self._admit_now, self._refund, max_in_flight=coalesce)
                           if coalesce > 0 else None)

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
        return await self.settle(permit.id, cancel, commits_for(permit.request, cancel))

    async def _admit_now(self, requests: list[AdmissionRequest]) -> list[Permit | Refusal]:
        payload = msgspec.json.encode(requests).decode()
        async with connection(self._pool) as conn:
            row = await fetch_one(conn, sql.queries["admit"], {"requests": payload})
        assert row is not None
        out: list[Permit | Refusal] = []
        for req, raw in zip(requests, row["results"], strict=True):
            if "permit_id" in raw:
                out.append(Permit(id=raw["permit_id"], request=req))
            else:
                out.append(_refusal(raw))
        return out

    async def settle(self, permit_id: str, outcome: Outcome,
                     commits: dict[str, int]) -> SettleResult:
        if outcome.kind is not OutcomeKind.INVALID:
            check_commit_values(commits)
        tokens, usd = _totals(outcome)
        params = {"permit_id": permit_id, "kind": str(outcome.kind),
                  "fingerprint": outcome_fingerprint(outcome.kind, commits),
                  "commits": json.dumps(commits), "detail": outcome.detail,
                  "tokens": tokens, "usd": usd}
        async with connection(self._pool) as conn:
            row = await fetch_one(conn, sql.queries["settle"], params)
        assert row is not None
        return _settle_result(permit_id, outcome, row["result"])

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

    async def counter(self, name: str) -> dict[str, Any] | None:
        """A counter or account row as stored (buckets not refilled), or None."""
        async with connection(self._pool) as conn:
            return await fetch_one(conn, sql.queries["counter"], {"key": name})

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

    async def frozen(self) -> list[FrozenCounter]:
        """Frozen money windows and accounts, with the invalid permit that froze each."""
        async with connection(self._pool) as conn:
            rows = await fetch_all(conn, sql.queries["frozen_counters"])
        return [FrozenCounter(**r) for r in rows]

    async def close(self) -> None:
        """The pool belongs to the app lifespan, which closes it."""
        return None


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


def _settle_result(permit_id: str, outcome: Outcome, raw: dict[str, Any]) -> SettleResult:
    if raw.get("unknown"):
        raise UnknownPermit(f"permit {permit_id!r} was never admitted by this store")
    if raw.get("conflict"):
        raise SettlementConflict(
            f"permit {permit_id} was already settled as {raw['kind']}; a different "
            f"outcome ({outcome.kind}) is refused")
    if raw.get("bad_commits"):
        raise InvalidUsage(f"commits[{raw['bad_commits']!r}]: {raw['problem']}")
    return SettleResult(permit_id=permit_id, kind=OutcomeKind(raw["kind"]),
                        tokens_committed=int(raw["tokens_committed"]),
                        usd_committed=int(raw["usd_committed"]),
                        replay=bool(raw["replay"]))
