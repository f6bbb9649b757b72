"""The generation routes as raw ASGI, below Litestar's request and response objects.

``POST /v1/chat/completions``, ``/v1/responses``, ``/v1/embeddings`` and ``/v1/messages``
are most of the gateway's traffic. Litestar's routing, its ``Request`` (headers as a
multi-dict, ``state``, the body stream), its exception middleware and its ``Response``
objects cost about as much CPU per request as the rest of the HTTP stack together
(a minimal handler: ≈ 58 µs under Litestar, ≈ 25 µs as raw ASGI under the same uvicorn).
So :class:`GatewayApp` (the app :func:`gateway.app.create_app` builds, a ``Litestar``)
hands exactly these method + path pairs to :class:`Generation` before Litestar sees them;
everything else, and these paths with another method or spelling (``405``, a trailing
slash), goes through Litestar, whose routes for them return the same :class:`Generation`
app, so a request is served by this one code path however it arrives.

The path is the same as it was under Litestar (DESIGN §3): authenticate → read the body
within ``server.max_body_bytes`` → parse → route → bound → admit → dispatch → settle, and
every error is rendered by the ingress's one renderer (``_render.error_reply``) with the
same status, headers, body shape, metrics label and audit line.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from litestar import Litestar
from litestar.exceptions import LitestarException

from gateway.ingress._attempt import Call, new_request_id
from gateway.ingress._bounds import input_bound, input_classes
from gateway.ingress._client import client_tool
from gateway.ingress._context import Gateway
from gateway.ingress._dispatch import dispatch
from gateway.ingress._prepare import (
    output_bound,
    parse_json,
    presented_key_hash,
    principal_to_admit,
    receive_body,
    route,
    wants_stream,
)
from gateway.ingress._render import error_reply
from gateway.ingress._reply import Reply, prepare
from gateway.keys import Principal
from gateway.pricing import cost_bound_micro_usd
from gateway.providers import Protocol_
from gateway.usage import Endpoint

_FORWARDED = ("anthropic-version", "anthropic-beta")


class _Exchange:
    """What the error renderer needs to know of one request, as far as it got."""

    __slots__ = ("call", "principal", "request_id")

    def __init__(self) -> None:
        self.request_id: str | None = None
        self.principal: Principal | None = None
        self.call: Call | None = None


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    """Request headers by name (uvicorn lower-cases them), the first value of each (as
    Litestar's ``request.headers.get`` read them)."""
    out: dict[str, str] = {}
    for name, value in scope["headers"]:
        key = name.decode("latin-1")
        if key not in out:
            out[key] = value.decode("latin-1")
    return out


class Generation:
    """One generation route (``endpoint``) as an ASGI app."""

    def __init__(self, endpoint: Endpoint, template: str) -> None:
        self.endpoint: Endpoint = endpoint
        self.template = template
        self.protocol: Protocol_ = "anthropic" if endpoint == "messages" else "openai"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        ex = _Exchange()
        try:
            gw: Gateway = scope["app"].state.gateway
            reply = await self._generate(gw, ex, _headers(scope), receive)
            asgi = prepare(reply)
        except Exception as exc:
            asgi = prepare(self._error(scope, exc, ex))
        try:
            await asgi(scope, receive, send)
        except Exception as exc:
            # As Litestar's exception middleware: once the head is out, the server closes
            # the connection (a stream's relay has already told the client in-band).
            raise LitestarException("Exception caught after response started") from exc

    def _error(self, scope: Any, exc: Exception, ex: _Exchange) -> Reply:
        return error_reply(
            getattr(scope["app"].state, "gateway", None), exc,
            anthropic=self.protocol == "anthropic", path=scope["path"],
            route=self.template, request_id=ex.request_id, principal=ex.principal,
            call=ex.call, user_agent=_headers(scope).get("user-agent"))

    async def _generate(self, gw: Gateway, ex: _Exchange, headers: dict[str, str],
                        receive: Any) -> Reply:
        endpoint = self.endpoint
        ex.request_id = rid = new_request_id()
        key_hash = presented_key_hash(headers)
        ex.principal = principal = await principal_to_admit(gw, key_hash)
        server = gw.settings.server
        body = await receive_body(receive, headers, server.max_body_bytes)
        doc = parse_json(body)
        target = route(gw, principal, doc, self.protocol)
        out = output_bound(doc, endpoint, target.model, ceiling=server.max_output_tokens)
        inp = input_bound(body, doc, target.model)
        # The µUSD bound as a function of the output allowance (budget fit and refusals
        # evaluate it at smaller max_tokens).
        classes = input_classes(doc)
        usd_bound_of = partial(cost_bound_micro_usd, inp, price=target.model.price,
                               input_classes=classes)
        ex.call = call = Call(
            gw=gw, principal=principal, endpoint=endpoint, model=target.model, doc=doc,
            body=body, stream=wants_stream(doc, endpoint), input_bound=inp,
            output_bound=out, usd_bound=usd_bound_of(out), usd_bound_of=usd_bound_of,
            client_headers={h: headers[h] for h in _FORWARDED if h in headers},
            deployments=target.deployments, request_id=rid, key_hash=key_hash,
            input_classes=classes, client=client_tool(headers.get("user-agent")))
        reply = await dispatch(call)
        gw.metrics.request_done(self.template, reply.status)
        return reply


GENERATION = {
    "/v1/chat/completions": Generation("chat", "/v1/chat/completions"),
    "/v1/responses": Generation("responses", "/v1/responses"),
    "/v1/embeddings": Generation("embeddings", "/v1/embeddings"),
    "/v1/messages": Generation("messages", "/v1/messages"),
}
"""Each generation route's template → its ASGI app."""


class GatewayApp(Litestar):
    """Litestar, with the generation routes' POSTs served by :class:`Generation` first."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            app = GENERATION.get(scope["path"])
            if app is not None:
                # What Litestar.__call__ sets before routing (the app, for the state).
                scope["app"] = scope["litestar_app"] = self
                scope.setdefault("state", {})
                await app(scope, receive, send)
                return
        await super().__call__(scope, receive, send)
