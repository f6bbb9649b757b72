"""``/admin/v1`` for operators: what crashes and invalid usage left behind, and how the
gateway stands.

- ``GET /admin/v1/permits?status=pending|uncertain|tokens_known``: permits awaiting an
  operator (pending ones keep binding every limit they charged; uncertain ones hold
  their bounds as liability), newest first, paged like the request log;
- ``POST /admin/v1/permits/{permit_id}/resolve``: settle one as ``mayu permits resolve``
  does (uncertain, cancelled, an exact µUSD figure or an exact usage), through the same
  service functions (:mod:`gateway.operations`);
- ``GET /admin/v1/frozen`` and ``POST /admin/v1/frozen/unfreeze``: the money windows
  and accounts invalid usage froze, and lifting one (``mayu accounts``);
- ``GET /admin/v1/status``: profile, version, policy generation, the database's schema
  revision (shared profile), this replica's settlement backlog and open permits, and in
  the lease profile this plane's heartbeat and leases;
- ``GET /admin/v1/alerts?since=``: the budget alerts fired since then.

Reads need a read token; the two writes a write token (the guards of
:mod:`gateway.admin._access`), each one audit line naming it. A store that fails is the
503 of :mod:`gateway.admin._errors`.
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, get, post
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from gateway import __version__, operations
from gateway.admin._access import Caller, read_access, write_access
from gateway.admin._routes import error_responses
from gateway.admin._usage import Cursor, RequestPage, cursor_of, position, view
from gateway.alerts import AlertEvent
from gateway.ceilings import MAX_AMOUNT, MAX_TOKENS_PER_CLASS
from gateway.errors import BadRequest
from gateway.governance import FrozenCounter, LogFilter, OutcomeKind, SettleResult
from gateway.ingress import Gateway
from gateway.standalone import standalone_warning

AnyRequest = Request[Any, Any, Any]
Awaiting = Literal["pending", "uncertain", "tokens_known"]
Tokens = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOKENS_PER_CLASS)]
Amount = Annotated[int, msgspec.Meta(ge=0, le=MAX_AMOUNT)]
PageSize = Annotated[int, QueryParameter(ge=1, le=500, description="page size (1-500)")]
Line = Annotated[str, msgspec.Meta(min_length=1, max_length=500, pattern=r"^[^\x00-\x1f\x7f]*$")]
"""One line of text, no control character (Postgres text cannot hold a NUL: a 400 here,
never a store error)."""


class UsageBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Exact token counts per class (the provider's record); a class left out is 0, but
    at least one must be given (``{}`` is a 400, not a $0 settlement)."""

    input: Tokens | msgspec.UnsetType = msgspec.UNSET
    output: Tokens | msgspec.UnsetType = msgspec.UNSET
    cache_read: Tokens | msgspec.UnsetType = msgspec.UNSET
    cache_write_5m: Tokens | msgspec.UnsetType = msgspec.UNSET
    cache_write_1h: Tokens | msgspec.UnsetType = msgspec.UNSET


class PermitResolve(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Exactly one of ``as``, ``usd_micros`` or ``usage``."""

    as_: Literal["uncertain", "cancelled"] | None = msgspec.field(default=None, name="as")
    """uncertain: the bounds become liability; cancelled: refund everything (only when
    the request never reached the provider)."""
    usd_micros: Amount | None = None
    """Settle at this exact cost (µUSD); with ``tokens`` the token count too, else the
    tokens stay liability."""
    tokens: Amount | None = None
    usage: UsageBody | None = None
    """Settle at this exact usage, priced with the model's configured price."""
    reason: Line = "no reason given"
    """Recorded in the settlement's detail as ``operator: <reason>``."""


class Resolved(msgspec.Struct, frozen=True, kw_only=True):
    permit_id: str
    status: str
    tokens_committed: int
    usd_committed: int
    tokens_liability: int
    usd_liability: int
    replay: bool
    """True: it was already settled so; nothing changed."""


class FrozenView(msgspec.Struct, frozen=True, kw_only=True):
    counter: str
    kind: str
    limit: int | None
    reserved: int
    committed: int
    liability: int
    frozen_by: str | None
    """The permit whose invalid usage froze it, when the store knows."""


class FrozenList(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["list"] = "list"
    data: list[FrozenView]


class Unfreeze(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    counter: Line


class Unfrozen(msgspec.Struct, frozen=True, kw_only=True):
    counter: str
    lifted: bool
    """False: it was not frozen; nothing changed."""


class LeaseView(msgspec.Struct, frozen=True, kw_only=True):
    account: str
    rule_uid: str
    allowance: int
    held: int
    limit: int | None
    remaining: int
    expires_in_s: float


class PlaneView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    version: str
    last_heartbeat_age_s: float | None
    """Seconds since inferplaned last answered (None: never since this start)."""
    heartbeats: int
    failures: int
    leases: list[LeaseView]


class Status(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["status"] = "status"
    profile: Literal["local", "shared", "lease"]
    replica: str
    version: str
    policy_generation: int
    schema_revision: list[str] | None
    """The database's alembic revision(s) (shared profile; None elsewhere)."""
    settlement_backlog: int
    """Settlements this replica holds for a store that could not take them."""
    open_permits: int
    """Permits this replica admitted and has not settled yet."""
    data_planes: list[PlaneView] | None
    """Lease profile: this plane (the others are inferplaned's to list)."""
    note: str
    warning: str | None = None
    """Standalone mode's "not recommended for production" (ADR-031); None otherwise."""
    telemetry_dropped_spans: int | None = None
    """Spans this process dropped since it started (collector down or the queue full;
    docs/telemetry.md); None with telemetry off."""


class AlertView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    counter: str
    scope: str
    period: str
    window: str
    threshold: int
    limit: int
    committed: int
    liability: int
    reserved: int
    replica: str
    first_seen_at: str


class AlertList(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["list"] = "list"
    enabled: bool
    """False: budget alerts are off here (server.alerts, or the lease profile)."""
    data: list[AlertView]


def _gateway(request: AnyRequest) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


def _store(request: AnyRequest) -> operations.OperatorStore:
    # Both governance stores (and the lease plane's) implement the operator protocol.
    store: operations.OperatorStore = _gateway(request).governance  # type: ignore[assignment]
    return store


_READS = error_responses()
_WRITES = error_responses(403, 404, 409)


@get("/admin/v1/permits", summary="Permits awaiting an operator (pending, uncertain)",
     responses=_READS, guards=[read_access])
async def list_permits(request: AnyRequest, status: FromQuery[Awaiting] = "pending",
                       cursor: Cursor = None, limit: PageSize = 100) -> RequestPage:
    """Newest first. A pending permit keeps binding every limit it charged until it is
    settled; an uncertain (or tokens-known) one is listed while it holds a liability,
    until an exact figure replaces it (so a page may hold fewer than ``limit``; follow
    ``next_cursor``)."""
    await _gateway(request).governor.caught_up(timeout_s=1.0)  # this replica's own first
    f = LogFilter(status=status, before=position(cursor))
    rows = await _gateway(request).governance.request_log(f, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    # A settled permit whose liability an exact figure replaced awaits nothing more.
    awaiting = [p for p in rows if status == "pending" or p.usd_liability
                or p.tokens_liability]
    return RequestPage(data=[view(p) for p in awaiting],
                       next_cursor=cursor_of(rows[-1]) if more else None)


@post("/admin/v1/permits/{permit_id:str}/resolve", status_code=200,
      summary="Resolve a permit (as mayu permits resolve)", responses=_WRITES,
      guards=[write_access])
async def resolve(request: AnyRequest, permit_id: FromPath[str],
                  data: JSONBody[PermitResolve], caller: Caller) -> Resolved:
    """Exactly once: the same resolution again is a replay (``replay: true``); a
    different outcome is a 409 naming the stored one. An exact figure (``usd_micros`` or
    ``usage``) also replaces an uncertain permit's liability."""
    given = [n for n in ("as_", "usd_micros", "usage") if getattr(data, n) is not None]
    if len(given) != 1:
        raise BadRequest("give exactly one of as, usd_micros or usage", param="as")
    if data.tokens is not None and data.usd_micros is None:
        raise BadRequest("tokens goes with usd_micros", param="tokens")
    gw = _gateway(request)
    store = _store(request)
    if data.as_ is not None:
        kind = OutcomeKind.UNCERTAIN if data.as_ == "uncertain" else OutcomeKind.CANCELLED
        result: SettleResult = await operations.resolve_permit(store, permit_id, kind,
                                                               data.reason)
    else:
        permit = await operations.permit_of(store, permit_id)
        if data.usage is not None:
            price = operations.price_of(gw.settings.models, permit.request.model)
            if price is None:
                raise BadRequest(f"model {permit.request.model!r} is not in this gateway's "
                                 "config, so its usage cannot be priced; give usd_micros",
                                 param="usage")
            counts = {k: v for k, v in msgspec.structs.asdict(data.usage).items()
                      if v is not msgspec.UNSET}
            settlement = operations.settlement_at_usage(
                permit, operations.usage_of(counts, label="usage"), price,
                reason=data.reason, label="usage")
        else:
            assert data.usd_micros is not None
            settlement = operations.settlement_at_cost(
                permit, usd=data.usd_micros, tokens=data.tokens, reason=data.reason,
                label="usd_micros")
        result = await operations.settle_as_operator(store, permit_id, settlement, exact=True)
    if not result.replay:
        gw.audit.write({"event": "admin", "action": "permit.resolve", "token": caller.name,
                        "permit": permit_id, "outcome": str(result.kind),
                        "usd_committed": result.usd_committed,
                        "usd_liability": result.usd_liability, "reason": data.reason})
    return Resolved(permit_id=permit_id, status=str(result.kind),
                    tokens_committed=result.tokens_committed,
                    usd_committed=result.usd_committed,
                    tokens_liability=result.tokens_liability,
                    usd_liability=result.usd_liability, replay=result.replay)


@get("/admin/v1/frozen", summary="Frozen money windows and accounts", responses=_READS,
     guards=[read_access])
async def list_frozen(request: AnyRequest) -> FrozenList:
    """Invalid upstream usage freezes every money window and account its permit charged
    (later requests on them get 402) until an operator unfreezes them."""
    await _gateway(request).governor.caught_up(timeout_s=1.0)
    found: list[FrozenCounter] = await _store(request).frozen()
    return FrozenList(data=[FrozenView(counter=f.counter, kind=f.kind, limit=f.limit,
                                       reserved=f.reserved, committed=f.committed,
                                       liability=f.liability, frozen_by=f.frozen_by)
                            for f in found])


@post("/admin/v1/frozen/unfreeze", status_code=200,
      summary="Lift a freeze (as mayu accounts unfreeze)", responses=_WRITES, guards=[write_access])
async def unfreeze_counter(request: AnyRequest, data: JSONBody[Unfreeze],
                           caller: Caller) -> Unfrozen:
    """After investigating the invalid usage; an unknown counter is a 404, one not
    frozen answers ``lifted: false`` and changes nothing."""
    lifted: bool = await operations.unfreeze(_store(request), data.counter)
    if lifted:
        _gateway(request).audit.write({"event": "admin", "action": "counter.unfreeze",
                                       "token": caller.name, "counter": data.counter})
    return Unfrozen(counter=data.counter, lifted=lifted)


@get("/admin/v1/status", summary="How this gateway stands", responses=_READS, guards=[read_access])
async def status(request: AnyRequest) -> Status:
    gw = _gateway(request)
    settings = gw.settings
    profile: Literal["local", "shared", "lease"] = (
        "shared" if settings.shared else
        "lease" if settings.control_plane is not None else "local")
    revision = await _schema_revision(gw) if gw.pool is not None else None
    planes = _this_plane(gw) if profile == "lease" else None
    note = {"shared": "no data planes in the shared profile: every replica admits "
                      "against the shared database",
            "local": "no data planes in the local profile",
            "lease": "this plane only: every plane's version, heartbeat and leases are "
                     "inferplaned's GET /v1alpha1/dataplanes (a reader token), which a "
                     "data plane's token may not read"}[profile]
    return Status(profile=profile, replica=settings.server.replica_id or socket.gethostname(),
                  version=__version__, policy_generation=gw.policy.snapshot().generation,
                  schema_revision=revision, settlement_backlog=gw.governor.backlog,
                  open_permits=gw.governor.open_permits, data_planes=planes, note=note,
                  warning=standalone_warning(settings),
                  telemetry_dropped_spans=(gw.telemetry.dropped() if gw.telemetry.enabled
                                           else None))


async def _schema_revision(gw: Gateway) -> list[str]:
    from gateway.db import connection
    from gateway.schema import database_heads_async

    async with connection(gw.pool, "governance database") as conn:
        return list(await database_heads_async(conn))


def _this_plane(gw: Gateway) -> list[PlaneView]:
    from gateway.lease import LeaseClient

    client = gw.policy
    if not isinstance(client, LeaseClient):
        return []
    state = client.state
    now = state.clock()
    age = None if state.last_success is None else round(now - state.last_success, 3)
    leases = [LeaseView(account=k, rule_uid=v.rule_uid, allowance=v.allowance,
                        held=v.held, limit=v.limit, remaining=v.remaining,
                        expires_in_s=round(v.expires - now, 3))
              for k, v in sorted(state.leases.items())]
    return [PlaneView(id=client.dataplane_id, version=__version__,
                      last_heartbeat_age_s=age, heartbeats=client.heartbeats,
                      failures=client.failures, leases=leases)]


Since = Annotated[datetime | None, QueryParameter(
    description="RFC 3339 time with an offset (default: the start of the UTC month)")]


@get("/admin/v1/alerts", summary="Budget alerts fired (80, 90, 100 % of a money budget)",
     responses=_READS, guards=[read_access])
async def list_alerts(request: AnyRequest, since: Since = None,
                      limit: PageSize = 100) -> AlertList:
    """Newest first: each budget's thresholds reached since ``since``, once per
    (budget, window, threshold) across every replica."""
    if since is not None and since.tzinfo is None:
        raise BadRequest("query parameter since: needs an offset (…Z or +00:00)",
                         param="since")
    store = _gateway(request).alerts
    if store is None:
        return AlertList(enabled=False, data=[])
    start = since or datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0,
                                               microsecond=0)
    events: list[AlertEvent] = await store.fired(since=start, limit=limit)
    return AlertList(enabled=True, data=[AlertView(
        id=e.id, counter=e.counter, scope=e.scope, period=e.period, window=e.window,
        threshold=e.threshold, limit=e.limit, committed=e.committed, liability=e.liability,
        reserved=e.reserved, replica=e.replica, first_seen_at=e.first_seen_at)
        for e in events])


ROUTES = [list_permits, resolve, list_frozen, unfreeze_counter, status, list_alerts]
