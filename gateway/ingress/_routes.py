"""The HTTP surface: OpenAI- and Anthropic-shaped routes, reports and health.

Every generation route runs the same path (DESIGN §3): authenticate → read the body
within ``server.max_body_bytes`` → parse → route → bound → admit → dispatch → settle.
Errors are rendered once, by :func:`error_handler`, in the calling protocol's shape.
Request metrics are labelled by the matched route *template* (:func:`route_label`), never
the raw path, so random paths cannot grow the series count. ``/metrics`` requires the
``server.metrics_token_ref`` bearer token when one is configured; ``/readyz`` fails from
the moment the server starts draining (``app.state.draining``).
"""

from __future__ import annotations

import hmac
import logging
from datetime import UTC, datetime
from functools import partial
from typing import Any

import msgspec
from litestar import MediaType, Request, Response, get, post
from litestar.exceptions import HTTPException

from gateway.config import resolve_secret
from gateway.errors import (
    BadRequest,
    GovernanceUnavailable,
    InferplaneError,
    NotFound,
    Unauthenticated,
    anthropic_error_body,
    openai_error_body,
)
from gateway.governance import utc_windows
from gateway.ingress._attempt import Call, new_request_id
from gateway.ingress._bounds import input_bound, input_classes
from gateway.ingress._context import Gateway
from gateway.ingress._dispatch import dispatch
from gateway.ingress._models import anthropic_client, retrieve_model
from gateway.ingress._prepare import (
    authenticate,
    output_bound,
    parse_json,
    presented_key,
    presented_key_hash,
    principal_to_admit,
    read_body,
    route,
    wants_stream,
)
from gateway.pricing import cost_bound_micro_usd
from gateway.providers import Protocol_
from gateway.usage import Endpoint, estimate_tokens, prompt_text

log = logging.getLogger("mayu.ingress")
_FORWARDED = ("anthropic-version", "anthropic-beta")

AnyRequest = Request[Any, Any, Any]


def route_label(request: AnyRequest) -> str:
    """The matched route's template (``/v1/chat/completions``), or ``unmatched``: a
    bounded set, whatever paths clients send."""
    template = request.scope.get("path_template")
    return template if isinstance(template, str) and template else "unmatched"


def gateway_of(request: AnyRequest) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


async def _generate(request: AnyRequest, endpoint: Endpoint) -> Response[Any]:
    gw = gateway_of(request)
    request.state.request_id = rid = new_request_id()
    key_hash = presented_key_hash(request)
    principal = await principal_to_admit(gw, key_hash)
    request.state.principal = principal
    body = await read_body(request, gw.settings.server.max_body_bytes)
    doc = parse_json(body)
    protocol: Protocol_ = "anthropic" if endpoint == "messages" else "openai"
    target = route(gw, principal, doc, protocol)
    out = output_bound(doc, endpoint, target.model, ceiling=gw.settings.server.max_output_tokens)
    inp = input_bound(body, doc, target.model)
    # The µUSD bound as a function of the output allowance (budget fit and refusals
    # evaluate it at smaller max_tokens).
    classes = input_classes(doc)
    usd_bound_of = partial(cost_bound_micro_usd, inp, price=target.model.price,
                           input_classes=classes)
    call = Call(gw=gw, principal=principal, endpoint=endpoint, model=target.model, doc=doc,
                body=body, stream=wants_stream(doc, endpoint), input_bound=inp,
                output_bound=out,
                usd_bound=usd_bound_of(out), usd_bound_of=usd_bound_of,
                client_headers={h: request.headers[h] for h in _FORWARDED
                                if h in request.headers},
                deployments=target.deployments, request_id=rid,
                key_hash=key_hash, input_classes=classes)
    request.state.call = call
    response = await dispatch(call)
    gw.metrics.requests.labels(route_label(request), str(response.status_code)).inc()
    return response


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: AnyRequest) -> Response[Any]:
    return await _generate(request, "chat")


@post("/v1/responses", status_code=200)
async def responses(request: AnyRequest) -> Response[Any]:
    return await _generate(request, "responses")


@post("/v1/embeddings", status_code=200)
async def embeddings(request: AnyRequest) -> Response[Any]:
    return await _generate(request, "embeddings")


@post("/v1/messages", status_code=200)
async def messages(request: AnyRequest) -> Response[Any]:
    return await _generate(request, "messages")


@post("/v1/messages/count_tokens", status_code=200)
async def count_tokens(request: AnyRequest) -> dict[str, int]:
    """Answered locally with the deterministic estimate: no provider call, no admission."""
    gw = gateway_of(request)
    principal = await authenticate(gw, request)
    doc = parse_json(await read_body(request, gw.settings.server.max_body_bytes))
    route(gw, principal, doc, "anthropic")
    return {"input_tokens": estimate_tokens(prompt_text(doc))}


@get("/v1/models")
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


@get("/v1/usage")
async def usage_report(request: AnyRequest) -> dict[str, Any]:
    """Committed and reserved tokens and µUSD: a key sees itself and its team; the admin
    token (``server.admin_token_ref``) sees everything."""
    gw = gateway_of(request)
    day, month = utc_windows(datetime.now(UTC))
    day = request.query_params.get("day", day)
    month = request.query_params.get("month", month)
    key = presented_key(request)
    scope: dict[str, str | None] = {"key_id": None, "team_id": None}
    is_admin = bool(gw.admin_token and key
                    and hmac.compare_digest(key.encode(), gw.admin_token.encode()))
    if not is_admin:
        principal = await authenticate(gw, request)
        scope = {"key_id": principal.key_id, "team_id": principal.team_id}
    try:
        rows = await gw.governance.usage(day=day, month=month, **scope)
    except InferplaneError:
        raise
    except Exception as exc:
        raise GovernanceUnavailable("governance store unavailable") from exc
    return {"object": "usage", "day": day, "month": month, **scope,
            "data": msgspec.to_builtins(rows)}


@get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz")
async def readyz(request: AnyRequest) -> Response[dict[str, str]]:
    if getattr(request.app.state, "draining", False):
        return Response({"status": "draining"}, status_code=503)
    ready = getattr(request.app.state, "gateway", None) is not None
    return Response({"status": "ready" if ready else "starting"},
                    status_code=200 if ready else 503)


@get("/metrics", media_type="text/plain")
async def metrics(request: AnyRequest) -> Response[bytes]:
    """Prometheus exposition; with ``server.metrics_token_ref`` only for its bearer."""
    gw = gateway_of(request)
    ref = gw.settings.server.metrics_token_ref
    if ref is not None:
        # Resolved per scrape (a file: reference can be rotated without a restart);
        # serve's preflight already proved it resolves.
        token = resolve_secret(ref, key="server.metrics_token_ref")
        presented = presented_key(request)
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


def _as_inferplane(exc: Exception) -> InferplaneError:
    if isinstance(exc, InferplaneError):
        return exc
    if isinstance(exc, HTTPException):
        # Litestar's own refusals (no such route, wrong method, client gone mid-body):
        # keep their status, pick the closest of our error kinds for type and code.
        detail = str(exc.detail)
        mapped: InferplaneError
        if exc.status_code == 401:
            mapped = Unauthenticated(detail)
        elif exc.status_code in (404, 405):
            mapped = NotFound(detail)
        elif exc.status_code >= 500:
            mapped = InferplaneError(detail)
        else:
            mapped = BadRequest(detail)
        # status is a ClassVar (each kind's default); this one instance keeps Litestar's
        # own status (405, 413, ...), which the renderer reads from the instance.
        mapped.status = exc.status_code  # type: ignore[misc]
        return mapped
    log.exception("unhandled error", exc_info=exc)
    return InferplaneError()


def error_handler(request: AnyRequest, exc: Exception) -> Response[Any]:
    """The one renderer of errors: status, headers and the ingress's own body shape.

    Errors raised before an attempt was admitted are audited here (refusals and upstream
    failures were audited by their attempt), so every request leaves one audit line.
    """
    err = _as_inferplane(exc)
    body = anthropic_error_body(err) if _anthropic_shaped(request) else openai_error_body(err)
    headers = err.headers()
    gw: Gateway | None = getattr(request.app.state, "gateway", None)
    rid = request.state.get("request_id")
    if rid:
        headers["x-inferplane-request-id"] = rid
    if gw is not None:
        gw.metrics.requests.labels(route_label(request), str(err.status)).inc()
        call: Call | None = request.state.get("call")
        if rid and (call is None or not call.audited):
            principal = request.state.get("principal")
            gw.audit.write({"request_id": rid, "path": request.url.path,
                            "key_id": principal.key_id if principal else None,
                            "team_id": principal.team_id if principal else None,
                            "status": err.status, "error": err.code, "detail": err.message})
    return Response(body, status_code=err.status, headers=headers, media_type=MediaType.JSON)


ROUTES = [chat_completions, responses, embeddings, messages, count_tokens, list_models,
          retrieve_model, usage_report, healthz, readyz, metrics]
