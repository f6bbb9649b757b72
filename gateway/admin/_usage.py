"""The request log: every admitted request as its permit recorded it, to filter, page,
sum, export and open one by one (``GET /admin/v1/requests``, ``/requests.csv``,
``/requests/summary``, ``/requests/{permit_id}``; a key's own: ``GET /v1/me/requests…``).

Built on what admission and settlement already write, the permits (nothing more is
written on the request path): who (key, team, user), which model, when, the bounds it
reserved, and once settled its outcome, committed and liability, tokens and µUSD.
Newest first, paged by an opaque cursor. The summary is added up by the store (one
``GROUP BY``: ``request_summary`` in both stores) the way ``/v1/usage`` and the counters
do: a settled permit its committed and, apart, its liability; a pending or invalid one
its bounds as reserved; a request cancelled before dispatch is not counted as a request.
So for one team and day the summary equals ``/v1/usage`` to the µUSD. With each permit
the settlement also keeps (``permit_facts``, in its own statement) the route, the
deployment that answered, the client tool its User-Agent names (``claude-code``,
``codex``, ``openai-python`` …) and the tokens per class the upstream reported; filter
and group by the tool.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, get
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import Stream

from gateway.admin._access import own_or_read
from gateway.admin._csv import MAX_EXPORT_ROWS, csv_export, read_ahead
from gateway.admin._routes import error_responses
from gateway.errors import BadRequest, NotFound
from gateway.governance import LogFilter, PermitInfo, SummaryFigures
from gateway.ingress import Gateway
from gateway.keys import Principal
from gateway.operations import OperatorStore
from gateway.otlp_import import ReportedFigures, ReportFilter, ReportStore

AnyRequest = Request[Any, Any, Any]
Status = Literal["pending", "complete", "tokens_known", "uncertain", "invalid", "cancelled"]
Group = Literal["team", "user", "key", "model", "tool"]
Bucket = Literal["day", "hour", "none"]

Text = Annotated[str | None, QueryParameter(min_length=1, max_length=200)]
Moment = Annotated[datetime | None, QueryParameter(
    description="RFC 3339 time with an offset (2026-12-04T00:00:00Z)")]
PageSize = Annotated[int, QueryParameter(ge=1, le=1000)]
Cursor = Annotated[str | None, QueryParameter(
    pattern=r"^(?:[0-9a-f]{2}){1,200}$", description="the next_cursor of the previous page")]
GroupBy = Annotated[str, QueryParameter(
    pattern=r"^(?:team|user|key|model|tool)(?:,(?:team|user|key|model|tool)){0,4}$",
    description="comma-separated: team, user, key, model, tool (the client tool)")]
Plane = Annotated[str | None, QueryParameter(
    min_length=1, max_length=253,
    description="one lease plane's requests (its data-plane id; the shared database "
                "holds every plane's request log)")]
Tool = Annotated[str | None, QueryParameter(
    pattern=r"^[a-z0-9-]{1,40}$",
    description="the client tool: claude-code, codex, openai-python, anthropic-python, "
                "openai-node, anthropic-node, curl, httpx, requests, litellm, other")]


class RequestView(msgspec.Struct, frozen=True, kw_only=True):
    permit_id: str
    request_id: str
    """The request's id, as its answer's ``x-inferplane-request-id`` says: every attempt
    of one request (a fallback's too) shares it; ``attempt`` tells them apart."""
    key_id: str
    team_id: str
    user: str | None
    model: str
    status: Status
    created_at: datetime
    token_bound: int
    usd_bound: int
    tokens_committed: int | None
    usd_committed: int | None
    tokens_liability: int | None
    usd_liability: int | None
    bound_exceeded: bool
    detail: str | None
    route: str | None = None
    """``/v1/chat/completions``, ``/v1/responses``, ``/v1/embeddings``, ``/v1/messages``
    (None: settled without the request's facts, e.g. by the journal replayer)."""
    deployment: str | None = None
    """``<provider>/<upstream model>`` that answered."""
    tool: str | None = None
    """The client tool its User-Agent names (``claude-code``, ``codex``, …, ``other``)."""
    http_status: int | None = None
    input_tokens: int | None = None
    """Tokens per class, as the upstream reported them (None: no usage reported)."""
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_5m_tokens: int | None = None
    cache_write_1h_tokens: int | None = None
    cache_write_unknown_tokens: int | None = None
    tier: str | None = None
    """``soft``: served by the model's cheaper tier (a caller past a soft budget,
    ``routing.soft_tier``); None: by its usual deployments."""
    attempt: int = 0
    """Which attempt of its request this permit is: 0 the first deployment tried, 1 the
    first fallback, and so on (docs/routing.md)."""
    plane: str | None = None
    """The lease plane that served it (the shared database holds every plane's request
    log, shipped to inferplaned: docs/lease.md); None: this gateway's own store."""


class RequestPage(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["list"] = "list"
    data: list[RequestView]
    next_cursor: str | None = None


class SegmentView(msgspec.Struct, frozen=True, kw_only=True):
    """One counter the request charged at admission (its reservation on it)."""

    counter: str
    kind: str
    """``bucket`` (a rate), ``window`` (a calendar day or month), ``account`` (a policy
    budget)."""
    dimension: str
    amount: int
    """Reserved on it at admission: requests, tokens or µUSD."""
    limit: int | None
    window: str | None
    rule_uid: str | None
    hard: bool


class RequestDetail(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["request"] = "request"
    request: RequestView
    policy_generation: int
    """The policy generation it was admitted under."""
    segments: list[SegmentView]


class Summary(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["summary"] = "summary"
    group_by: list[Group]
    bucket: Bucket
    data: list[SummaryFigures]


_COLUMNS = RequestView.__struct_fields__


def attempt_of(stored: str) -> tuple[str, int]:
    """A permit's stored request id taken apart: (the request's id, the attempt). The
    store keeps each attempt's own id (``req_….1`` for the first fallback), which its
    admission is swept and replayed by (docs/routing.md)."""
    rid, dot, n = stored.rpartition(".")
    return (rid, int(n)) if dot and n.isdigit() else (stored, 0)


def view(p: PermitInfo) -> RequestView:
    request_id, attempt = attempt_of(p.request_id)
    return RequestView(permit_id=p.id, request_id=request_id, attempt=attempt,
                       key_id=p.key_id,
                       team_id=p.team_id, user=p.user, model=p.model,
                       status=p.status,  # type: ignore[arg-type]
                       created_at=p.created_at, token_bound=p.token_bound,
                       usd_bound=p.usd_bound, tokens_committed=p.tokens_committed,
                       usd_committed=p.usd_committed, tokens_liability=p.tokens_liability,
                       usd_liability=p.usd_liability, bound_exceeded=p.bound_exceeded,
                       detail=p.detail, route=p.route, deployment=p.deployment,
                       tool=p.client, http_status=p.http_status,
                       input_tokens=p.input_tokens, output_tokens=p.output_tokens,
                       cache_read_tokens=p.cache_read_tokens,
                       cache_write_5m_tokens=p.cache_write_5m_tokens,
                       cache_write_1h_tokens=p.cache_write_1h_tokens,
                       cache_write_unknown_tokens=p.cache_write_unknown_tokens,
                       tier=p.tier, plane=p.plane)


def cursor_of(p: PermitInfo) -> str:
    return f"{p.created_at.isoformat()}|{p.id}".encode().hex()


def position(cursor: str | None) -> tuple[datetime, str] | None:
    if cursor is None:
        return None
    try:
        at, permit = bytes.fromhex(cursor).decode().split("|", 1)
        return datetime.fromisoformat(at), permit
    except ValueError:
        raise BadRequest("query parameter cursor: not a cursor this API returned",
                         param="cursor") from None


def _aware(name: str, moment: datetime | None) -> datetime | None:
    if moment is not None and moment.tzinfo is None:
        raise BadRequest(f"query parameter {name}: needs an offset (…Z or +00:00)",
                         param=name)
    return moment


async def _filter(request: AnyRequest, *, team: str | None, key_id: str | None,
                  user: str | None, model: str | None, status: Status | None,
                  since: datetime | None, until: datetime | None,
                  cursor: str | None, tool: str | None = None,
                  plane: str | None = None) -> LogFilter:
    """The filter, for an admin token (any team, key) or a key (itself only: the
    ``holder`` :func:`~gateway.admin._access.own_or_read` let in)."""
    gw: Gateway = request.app.state.gateway
    principal: Principal | None = request.state.get("key_holder")
    if principal is not None:
        team, key_id = None, principal.key_id
        team_id = principal.team_id
    else:
        team_id = None
        if team is not None:
            found = await gw.key_store.get_team(team)
            team_id = found.id if found is not None else team
    return LogFilter(team_id=team_id, key_id=key_id, user=user, model=model, status=status,
                     client=tool, plane=plane, since=_aware("since", since),
                     until=_aware("until", until), before=position(cursor))


async def _read(request: AnyRequest, f: LogFilter, limit: int | None) -> list[PermitInfo]:
    gw: Gateway = request.app.state.gateway
    await gw.governor.caught_up(timeout_s=1.0)
    rows: list[PermitInfo] = await gw.governance.request_log(f, limit=limit)
    return rows


_ERRORS = error_responses()


@get(["/admin/v1/requests", "/v1/me/requests"], summary="The request log, newest first",
     responses=_ERRORS, guards=[own_or_read])
async def list_requests(request: AnyRequest, team: Text = None, key_id: Text = None,
                        user: Text = None, model: Text = None,
                        status: FromQuery[Status | None] = None, since: Moment = None,
                        until: Moment = None, cursor: Cursor = None,
                        limit: PageSize = 100, tool: Tool = None,
                        plane: Plane = None) -> RequestPage:
    """Admins (read token) see every permit; a key (``/v1/me/requests``) only its own."""
    f = await _filter(request, team=team, key_id=key_id, user=user, model=model,
                      status=status, since=since, until=until, cursor=cursor, tool=tool,
                      plane=plane)
    rows = await _read(request, f, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return RequestPage(data=[view(p) for p in rows],
                       next_cursor=cursor_of(rows[-1]) if more else None)


@get(["/admin/v1/requests.csv", "/v1/me/requests.csv"], media_type="text/csv",
     summary="The request log as CSV (every row the filter matches)", responses=_ERRORS,
     guards=[own_or_read])
async def export_requests(request: AnyRequest, team: Text = None, key_id: Text = None,
                          user: Text = None, model: Text = None,
                          status: FromQuery[Status | None] = None, since: Moment = None,
                          until: Moment = None, tool: Tool = None,
                          plane: Plane = None) -> Stream:
    """The same rows and columns as the JSON list, newest first, one header line; money
    in integer µUSD, times in RFC 3339, an empty cell for null; streamed a page at a
    time, at most ``MAX_EXPORT_ROWS`` rows, text cells neutralised (gateway/admin/_csv.py)."""
    f = await _filter(request, team=team, key_id=key_id, user=user, model=model,
                      status=status, since=since, until=until, cursor=None, tool=tool,
                      plane=plane)
    gw: Gateway = request.app.state.gateway
    await gw.governor.caught_up(timeout_s=1.0)

    async def read(page: LogFilter, limit: int) -> list[PermitInfo]:
        rows: list[PermitInfo] = await gw.governance.request_log(page, limit=limit)
        return rows

    chunks = await read_ahead(csv_export(
        read, f, columns=_COLUMNS, cells=lambda p: _cells(msgspec.to_builtins(view(p)))))
    return Stream(chunks, media_type="text/csv",
                  headers={"Content-Disposition": 'attachment; filename="requests.csv"',
                           "X-Export-Row-Cap": str(MAX_EXPORT_ROWS)})


def _cells(row: dict[str, Any]) -> Iterable[Any]:
    return ["" if row[c] is None else str(row[c]).lower() if isinstance(row[c], bool)
            else row[c] for c in _COLUMNS]


@get(["/admin/v1/requests/summary", "/v1/me/requests/summary"],
     summary="The request log summed by team, user, key, model, tool and day or hour",
     responses=_ERRORS, guards=[own_or_read])
async def summarize_requests(request: AnyRequest, group_by: GroupBy = "team",
                             bucket: FromQuery[Bucket] = "day", team: Text = None,
                             key_id: Text = None, user: Text = None, model: Text = None,
                             status: FromQuery[Status | None] = None, since: Moment = None,
                             until: Moment = None, tool: Tool = None,
                             plane: Plane = None) -> Summary:
    """Committed, liability and reserved per group and period, as ``/v1/usage`` counts
    them; rows sorted by period, then the groups."""
    f = await _filter(request, team=team, key_id=key_id, user=user, model=model,
                      status=status, since=since, until=until, cursor=None, tool=tool,
                      plane=plane)
    groups: list[Group] = list(dict.fromkeys(group_by.split(",")))  # type: ignore[arg-type]
    gw: Gateway = request.app.state.gateway
    await gw.governor.caught_up(timeout_s=1.0)
    summed = await gw.governance.request_summary(f, groups=tuple(groups), bucket=bucket)
    fields = [_FIELD[g] for g in groups]
    rows = sorted(summed, key=lambda r: tuple(
        "" if v is None else str(v) for v in (r.period, *(getattr(r, k) for k in fields))))
    return Summary(group_by=groups, bucket=bucket, data=rows)


_FIELD = {"team": "team_id", "user": "user", "key": "key_id", "model": "model",
          "tool": "tool"}


@get(["/admin/v1/requests/{permit_id:str}", "/v1/me/requests/{permit_id:str}"],
     summary="One request of the log: its figures, outcome and the counters it charged",
     responses=error_responses(404), guards=[own_or_read])
async def get_request(request: AnyRequest, permit_id: FromPath[str]) -> RequestDetail:
    """Admins any permit; a key (``/v1/me/requests/{id}``) only its own (another's is
    a 404, as an unknown one)."""
    f = await _filter(request, team=None, key_id=None, user=None, model=None, status=None,
                      since=None, until=None, cursor=None)
    gw: Gateway = request.app.state.gateway
    await gw.governor.caught_up(timeout_s=1.0)
    store: OperatorStore = gw.governance  # type: ignore[assignment]  # both stores
    info = await store.permit_info(permit_id)
    permit = await store.get_permit(permit_id) if info is not None else None
    if info is None or permit is None or (f.key_id is not None and info.key_id != f.key_id):
        raise NotFound(f"request {permit_id!r}: no such permit in the request log")
    req = permit.request
    return RequestDetail(request=view(info), policy_generation=req.policy_generation,
                         segments=[SegmentView(counter=c.counter, kind=c.kind,
                                               dimension=c.dimension, amount=c.amount,
                                               limit=c.limit, window=c.window,
                                               rule_uid=c.rule_uid, hard=c.hard)
                                   for c in req.charges])


ROUTES = [list_requests, export_requests, summarize_requests, get_request]


# -- the agents' own usage reports beside the gateway's (gateway/otlp_import) -------------

AgentGroup = Literal["team", "user", "key"]
AgentGroupBy = Annotated[str, QueryParameter(
    pattern=r"^(?:team|user|key)(?:,(?:team|user|key)){0,2}$",
    description="comma-separated: team, user, key")]

GAP_SHARE = 0.10
"""A gap is flagged when the agents reported more than the gateway saw by over this share
of what they reported …"""
GAP_MIN_TOKENS = 1000
"""… and by over this many tokens (a request admitted just before midnight and reported
just after is a small gap, not traffic around the gateway)."""
MAX_SESSIONS = 1000


class GatewayFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What the gateway admitted and committed (the request log, as ``/v1/usage``)."""

    requests: int = 0
    tokens_committed: int = 0
    usd_committed: int = 0
    tokens_liability: int = 0
    usd_liability: int = 0
    tokens_reserved: int = 0
    usd_reserved: int = 0


class ReportedView(msgspec.Struct, frozen=True, kw_only=True):
    """What the agents reported about themselves over OTLP (never billed)."""

    reports: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    tokens: int = 0
    reported_cost_uusd: int | None = None
    """The agents' own estimate, µUSD (None: they reported none; Codex does not)."""


class AgentUsageRow(msgspec.Struct, frozen=True, kw_only=True):
    team_id: str | None = None
    user: str | None = None
    key_id: str | None = None
    period: str | None = None
    gateway: GatewayFigures
    reported: ReportedView
    gap_tokens: int
    """Reported tokens minus the gateway's committed + liability + reserved tokens:
    above zero, the agents say they used more than passed through the gateway."""
    gap_uusd: int | None
    """The agents' own cost estimate minus the gateway's committed + liability +
    reserved µUSD (their estimate is list price: a guide, not a bill); None when they
    reported no cost."""
    bypass_suspected: bool
    """The token gap is over ``GAP_SHARE`` of what was reported and ``GAP_MIN_TOKENS``."""


class AgentSession(msgspec.Struct, frozen=True, kw_only=True):
    key_id: str | None
    team_id: str | None
    user: str | None
    session_id: str | None
    agent: str | None
    reported: ReportedView
    first_at: datetime | None
    last_at: datetime | None


class AgentUsage(msgspec.Struct, frozen=True, kw_only=True):
    object: Literal["agent_usage"] = "agent_usage"
    group_by: list[AgentGroup]
    bucket: Literal["day", "none"]
    data: list[AgentUsageRow]
    sessions: list[AgentSession]
    """Per agent session (newest first, at most ``MAX_SESSIONS``): the gateway does not
    know an agent's session, so these are the reported side only."""


def _reported(r: ReportedFigures) -> ReportedView:
    return ReportedView(reports=r.reports, input_tokens=r.input_tokens,
                        output_tokens=r.output_tokens, cache_read_tokens=r.cache_read_tokens,
                        cache_write_tokens=r.cache_write_tokens, tokens=r.tokens,
                        reported_cost_uusd=r.reported_cost_uusd)


def _side_by_side(gateway: list[SummaryFigures], reported: list[ReportedFigures]
                  ) -> list[AgentUsageRow]:
    rows: dict[tuple[str | None, ...], tuple[GatewayFigures, ReportedView]] = {}
    for g in gateway:
        key = (g.period, g.team_id, g.user, g.key_id)
        rows[key] = (GatewayFigures(**{f: getattr(g, f)
                                       for f in GatewayFigures.__struct_fields__}),
                     ReportedView())
    for r in reported:
        key = (r.period, r.team_id, r.user, r.key_id)
        rows[key] = (rows.get(key, (GatewayFigures(), None))[0], _reported(r))
    out = []
    for (period, team, user, key_id), (gw, rep) in sorted(
            rows.items(), key=lambda kv: tuple("" if v is None else v for v in kv[0])):
        gap = rep.tokens - gw.tokens_committed - gw.tokens_liability - gw.tokens_reserved
        out.append(AgentUsageRow(
            team_id=team, user=user, key_id=key_id, period=period, gateway=gw, reported=rep,
            gap_tokens=gap,
            gap_uusd=None if rep.reported_cost_uusd is None else
            rep.reported_cost_uusd - gw.usd_committed - gw.usd_liability - gw.usd_reserved,
            bypass_suspected=gap > max(GAP_MIN_TOKENS, GAP_SHARE * rep.tokens)))
    return out


@get(["/admin/v1/agent-usage", "/v1/me/agent-usage"],
     summary="What the agents reported about their own usage, beside what the gateway "
             "committed", responses=_ERRORS, guards=[own_or_read])
async def agent_usage(request: AnyRequest, group_by: AgentGroupBy = "team,user,key",
                      bucket: FromQuery[Literal["day", "none"]] = "day", team: Text = None,
                      key_id: Text = None, user: Text = None, since: Moment = None,
                      until: Moment = None) -> AgentUsage:
    """Per group and UTC day: the gateway's committed, liability and reserved figures
    (the request log) and the usage Claude Code or Codex exported to the gateway's OTLP
    receiver for the same keys (``POST /v1/logs``, ``/v1/metrics``), with the gap; and
    the reports per agent session. A key (``/v1/me/agent-usage``) sees only its own."""
    f = await _filter(request, team=team, key_id=key_id, user=user, model=None, status=None,
                      since=since, until=until, cursor=None)
    groups: list[AgentGroup] = list(dict.fromkeys(group_by.split(",")))  # type: ignore[arg-type]
    gw: Gateway = request.app.state.gateway
    reports: ReportStore = request.app.state.agent_usage
    await gw.governor.caught_up(timeout_s=1.0)
    gateway = await gw.governance.request_summary(f, groups=tuple(groups), bucket=bucket)
    rf = ReportFilter(team_id=f.team_id, key_id=f.key_id, user=f.user, since=f.since,
                      until=f.until)
    reported = await reports.summary(rf, groups=tuple(groups), bucket=bucket)
    sessions = await reports.summary(rf, groups=("team", "user", "key", "session", "agent"),
                                     bucket="none")
    sessions.sort(key=lambda s: s.last_at or datetime.min.replace(tzinfo=UTC), reverse=True)
    return AgentUsage(group_by=groups, bucket=bucket, data=_side_by_side(gateway, reported),
                      sessions=[AgentSession(key_id=s.key_id, team_id=s.team_id, user=s.user,
                                             session_id=s.session_id, agent=s.agent,
                                             reported=_reported(s), first_at=s.first_at,
                                             last_at=s.last_at)
                                for s in sessions[:MAX_SESSIONS]])


ROUTES = [*ROUTES, agent_usage]
