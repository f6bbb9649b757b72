"""The HTTP surface: OpenAI- and Anthropic-shaped routes, reports and health.

Every generation route runs the same path (DESIGN §3): authenticate → read the body
within ``server.max_body_bytes`` → parse → route → bound → admit → dispatch → settle,
served as raw ASGI below Litestar (:mod:`gateway.ingress._asgi`). Errors are rendered
once, by ``_render.error_reply`` (here through :func:`error_handler`, Litestar's), in the
calling protocol's shape.
Request metrics are labelled by the matched route *template* (:func:`route_label`), never
the raw path, so random paths cannot grow the series count. ``/metrics`` requires the
``server.metrics_token_ref`` bearer token when one is configured; ``/readyz`` fails from
the moment the server starts draining (``app.state.draining``).
"""

from __future__ import annotations

import hmac
import re
from datetime import UTC, date, datetime
from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.types import ASGIApp

from gateway.config import resolve_secret
from gateway.errors import BadRequest, GovernanceUnavailable, InferplaneError, Unauthenticated
from gateway.governance import utc_windows
from gateway.ingress._asgi import GENERATION
from gateway.ingress._bedrock import BEDROCK
from gateway.ingress._context import Gateway
from gateway.ingress._me import me_report
from gateway.ingress._models import anthropic_client, retrieve_model
from gateway.ingress._prepare import authenticate, parse_json, presented_key, read_body, route
from gateway.ingress._render import error_reply
from gateway.ingress._reply import to_litestar
from gateway.ingress._vertex import VERTEX
from gateway.standalone import standalone_warning
from gateway.usage import estimate_tokens, prompt_text

USAGE_CATCH_UP_S = 1.0
"""How long ``GET /v1/usage`` waits for this replica's settlements still in flight
(their answers left first) before it reads; past it, they show as reserved."""

_PERIODS = {"day": ("YYYY-MM-DD", re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")),
            "month": ("YYYY-MM", re.compile(r"[0-9]{4}-[0-9]{2}"))}

AnyRequest = Request[Any, Any, Any]


def route_label(request: AnyRequest) -> str:
    """The matched route's template (``/v1/chat/completions``), or ``unmatched``: a
    bounded set, whatever paths clients send."""
    template = request.scope.get("path_template")
    return template if isinstance(template, str) and template else "unmatched"


def gateway_of(request: AnyRequest) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


# The generation routes are served by gateway.ingress._asgi.Generation (below Litestar:
# GatewayApp hands their POSTs to it first). This route claims their paths for Litestar's
# own routing (another method: 405; a trailing slash) and returns the matched path's app.
@post(list(GENERATION), status_code=200, include_in_schema=False)
async def generation(request: AnyRequest) -> ASGIApp:
    return GENERATION[route_label(request)]


@post(["/bedrock/model/{model_id:str}/invoke",
       "/bedrock/model/{model_id:str}/invoke-with-response-stream"],
      status_code=200, include_in_schema=False)
async def bedrock_invoke() -> ASGIApp:
    """Bedrock's runtime operations (``gateway.ingress._bedrock``)."""
    return BEDROCK


@post(["/v1/projects/{project:str}/locations/{region:str}/publishers/anthropic/models/"
       "{method:str}", "/v1beta1/projects/{project:str}/locations/{region:str}/publishers/"
       "anthropic/models/{method:str}"], status_code=200, include_in_schema=False)
async def vertex_predict() -> ASGIApp:
    """Vertex AI's rawPredict / streamRawPredict (``gateway.ingress._vertex``)."""
    return VERTEX


@post("/v1/messages/count_tokens", status_code=200, include_in_schema=False)
async def count_tokens(request: AnyRequest) -> dict[str, int]:
    """Answered locally with the deterministic estimate: no provider call, no admission."""
    gw = gateway_of(request)
    principal = await authenticate(gw, request)
    doc = parse_json(await read_body(request, gw.settings.server.max_body_bytes))
    route(gw, principal, doc, "anthropic")
    return {"input_tokens": estimate_tokens(prompt_text(doc))}


@get("/v1/models", include_in_schema=False)
async def list_models(request: AnyRequest) -> dict[str, Any]:
    """Configured models this key may use, in a shape both SDKs accept."""
    gw = gateway_of(request)
    principal = await authenticate(gw, request)
    names = [m for m in gw.models if principal.may_use(m)]
    data = [{"id": n, "object": "model", "type": "model", "created": 0,
             "created_at": "1970-01-01T00:00:00Z", "display_name": n,
             "owned_by": "inferplane"} for n in names]
    return {"object": "list", "data": data, "has_more": False,
            "first_id": names[0] if names else None, "last_id": names[-1] if names else None}


@get("/v1/usage", include_in_schema=False)
async def usage_report(request: AnyRequest) -> dict[str, Any]:
    """Committed and reserved tokens and µUSD: a key sees itself and its team; an admin
    token (``server.admin_tokens``, ``server.admin_token_ref``) sees everything."""
    gw = gateway_of(request)
    day, month = utc_windows(datetime.now(UTC))
    day, month = _period(request, "day", day), _period(request, "month", month)
    key = presented_key(request.headers)
    scope: dict[str, str | None] = {"key_id": None, "team_id": None}
    # Any admin token (server.admin_tokens, either tier, or server.admin_token_ref).
    is_admin = request.app.state.admin.caller(key) is not None
    if not is_admin:
        principal = await authenticate(gw, request)
        scope = {"key_id": principal.key_id, "team_id": principal.team_id}
    # Answers do not wait for their settlements (server.settle_wait_s): the ones still
    # in flight are waited for, so a caller reads its own finished requests as committed.
    await gw.governor.caught_up(timeout_s=USAGE_CATCH_UP_S)
    try:
        rows = await gw.governance.usage(day=day, month=month, **scope)
    except InferplaneError:
        raise
    except Exception as exc:
        raise GovernanceUnavailable("governance store unavailable") from exc
    return {"object": "usage", "day": day, "month": month, **scope,
            "data": msgspec.to_builtins(rows)}


@get("/v1/me", include_in_schema=False)
async def me(request: AnyRequest) -> dict[str, Any]:
    """The presented key's own limits (key, team, policy) with limit, committed,
    liability, reserved, remaining and resets_at (:mod:`gateway.ingress._me`)."""
    gw = gateway_of(request)
    principal = await authenticate(gw, request)
    await gw.governor.caught_up(timeout_s=USAGE_CATCH_UP_S)
    try:
        return await me_report(gw, principal)
    except InferplaneError:
        raise
    except Exception as exc:
        raise GovernanceUnavailable("governance store unavailable") from exc


def _period(request: AnyRequest, name: str, default: str) -> str:
    """The ``day`` or ``month`` query parameter (``default`` when absent): a real UTC
    calendar day or month, else a 400 naming it, before anything reads a store."""
    text: str | None = request.query_params.get(name)
    if text is None:
        return default
    shape, pattern = _PERIODS[name]
    try:
        valid = pattern.fullmatch(text) is not None and bool(
            date.fromisoformat(text if name == "day" else f"{text}-01"))
    except ValueError:  # 2026-02-30, 2026-13
        valid = False
    if not valid:
        raise BadRequest(f"query parameter {name}: must be a UTC {name} as {shape} "
                         f"(e.g. {default})", param=name)
    return text


@get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz", include_in_schema=False)
async def readyz(request: AnyRequest) -> Response[dict[str, str]]:
    if getattr(request.app.state, "draining", False):
        return Response({"status": "draining"}, status_code=503)
    gw: Gateway | None = getattr(request.app.state, "gateway", None)
    if gw is None:
        return Response({"status": "starting"}, status_code=503)
    warning = standalone_warning(gw.settings)  # ADR-031: standalone says so
    return Response({"status": "ready", **({"detail": warning} if warning else {})})


@get("/metrics", media_type="text/plain", include_in_schema=False)
async def metrics(request: AnyRequest) -> Response[bytes]:
    """Prometheus exposition; with ``server.metrics_token_ref`` only for its bearer."""
    gw = gateway_of(request)
    ref = gw.settings.server.metrics_token_ref
    if ref is not None:
        # Resolved per scrape (a file: reference can be rotated without a restart);
        # serve's preflight already proved it resolves.
        token = resolve_secret(ref, key="server.metrics_token_ref")
        presented = presented_key(request.headers)
        if not (presented and hmac.compare_digest(presented.encode(), token.encode())):
            raise Unauthenticated("/metrics requires the metrics token "
                                  "(Authorization: Bearer ...)")
    # scrape(): the shared profile's cluster gauges are read from the database first
    # (at most every few seconds, gateway/cluster_metrics.py).
    return Response(await gw.metrics.scrape(), media_type=gw.metrics.content_type)


def _anthropic_shaped(request: AnyRequest) -> bool:
    """Messages routes answer in Anthropic's shape; the models routes in the shape of
    the client that asks (``anthropic_client``); everything else in OpenAI's."""
    path = request.url.path
    return path.startswith("/v1/messages") or (path.startswith("/v1/models")
                                               and anthropic_client(request))


def error_handler(request: AnyRequest, exc: Exception) -> Response[Any]:
    """Litestar's exception handler: the ingress's one renderer (``_render.error_reply``)."""
    gw: Gateway | None = getattr(request.app.state, "gateway", None)
    reply = error_reply(gw, exc, anthropic=_anthropic_shaped(request), path=request.url.path,
                        route=route_label(request), request_id=request.state.get("request_id"),
                        principal=request.state.get("principal"),
                        call=request.state.get("call"))
    return to_litestar(reply)


ROUTES = [generation, bedrock_invoke, vertex_predict, count_tokens, list_models, retrieve_model,
          usage_report, me, healthz, readyz, metrics]
