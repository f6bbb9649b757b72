"""inferplaned's request log of every lease plane: ``POST /v1alpha1/usage``.

A lease plane ships each settled request's usage record (never a payload:
:class:`gateway.lease.UsageRecord`) from its spool (:class:`gateway.lease.UsageSpool`) in batches.
Each batch is authenticated like a heartbeat — a data-plane token, for a plane id its
``planes`` allow, and only by the token that plane first synced with (a plane that has
not synced yet is told to sync first: 409) — and stored in one statement
(``store_usage`` in ``sql/usage_queries.sql``) into the shared request log (``permits``
and ``permit_facts``, marked with the plane), idempotent by permit id: a batch sent
twice stores once, and the answer says which ids are stored, held already, held by
another plane, or refused (a team outside the token's ``teams``: never stored, counted
in ``inferplaned_usage_records_total{outcome="refused"}`` and logged).

Counters and policy accounts are not charged by these rows: the plane's heartbeat
reports its spend to the ledger (:mod:`controlplane.leases`); the request log explains
it request by request, and the admin API's and the console's request log on the shared
database list them with their plane (filter ``plane=<id>``).
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar import Request, Response, post
from prometheus_client import CollectorRegistry, Counter

import sql
from controlplane.auth import Identity, TokenAuth
from controlplane.body import bounded_body, decode_body
from gateway.db import Pool, fetch_all, fetch_one, wrap_exceptions
from gateway.errors import InferplaneError
from gateway.lease import USAGE_PATH, UsageAck, UsageBatch, UsageRecord

log = logging.getLogger("inferplaned.usage")
_WHAT = "request log database"
OUTCOMES = ("stored", "present", "conflict", "refused")


class PlaneNotSynced(InferplaneError, status=409, code="plane_not_synced"):
    """This data plane has not synced yet: its first heartbeat binds it to its token."""


class PlaneOfAnotherToken(InferplaneError, status=409, code="token_conflict"):
    """This data plane belongs to another data-plane token."""


class UsageLog:
    """Stores lease planes' usage records in the shared request log."""

    def __init__(self, *, pool: Pool, registry: CollectorRegistry) -> None:
        self._pool = pool
        self.records = Counter("inferplaned_usage_records", "Lease planes' usage records "
                               "by outcome (stored, present: sent again, conflict: id "
                               "held by another plane, refused: a team the token may "
                               "not report).", ["outcome"], registry=registry)
        for outcome in OUTCOMES:
            self.records.labels(outcome=outcome)

    async def store(self, batch: UsageBatch, identity: Identity) -> UsageAck:
        teams = identity.teams
        allowed = [r for r in batch.records if teams is None or r.team in teams]
        refused = [r.id for r in batch.records if teams is not None and r.team not in teams]
        if refused:
            log.error("usage records refused: token %r may not report team(s) %s "
                      "(plane %s, %d records)", identity.name,
                      sorted({r.team for r in batch.records if r.id in set(refused)}),
                      batch.plane, len(refused))
        rows: list[dict[str, Any]] = []
        async with (wrap_exceptions(_WHAT), self._pool.connection() as conn,
                    conn.transaction()):
            owner = await fetch_one(conn, sql.usage_queries["usage_plane_token"],
                                    {"plane": batch.plane})
            if owner is None:
                raise PlaneNotSynced(f"data plane {batch.plane!r} has not synced yet "
                                     "(POST /v1alpha1/sync first)")
            if owner["token_name"] != identity.name:
                raise PlaneOfAnotherToken(f"data plane {batch.plane!r} belongs to "
                                          "another data-plane token")
            if allowed:
                rows = await fetch_all(conn, sql.usage_queries["store_usage"], {
                    "plane": batch.plane, "records": _json(allowed)})
        by_state: dict[str, list[str]] = {o: [] for o in OUTCOMES}
        for row in rows:
            by_state[row["state"]].append(row["id"])
        by_state["refused"] = refused
        for outcome, ids in by_state.items():
            if ids:
                self.records.labels(outcome=outcome).inc(len(ids))
        if by_state["conflict"]:
            log.error("usage records of plane %s not stored: %d ids held by another "
                      "plane or the shared profile", batch.plane, len(by_state["conflict"]))
        return UsageAck(stored=by_state["stored"], present=by_state["present"],
                        conflicts=by_state["conflict"], refused=refused)


def _json(records: list[UsageRecord]) -> str:
    return msgspec.json.encode(records).decode()


@post(USAGE_PATH, status_code=200)
async def usage(request: Request[Any, Any, Any]) -> Response[bytes]:
    """A lease plane's batch of usage records in; which ids are stored out."""
    auth: TokenAuth = request.app.state.auth
    identity = auth.require_dataplane(request.headers.get("authorization"))
    body = await bounded_body(request, limit="max_sync_bytes")
    batch = decode_body(body, UsageBatch, what="a usage batch")
    auth.require_plane(identity, batch.plane)
    store: UsageLog = request.app.state.usage_log
    ack = await store.store(batch, identity)
    return Response(msgspec.json.encode(ack), media_type="application/json")


ROUTES = [usage]
