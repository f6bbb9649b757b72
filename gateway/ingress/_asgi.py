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
within ``server.max_body_bytes`` → parse → route → bound → admit → dispatch → settle
(``gateway.ingress._dispatch.serve``, stage by stage), and every error is rendered by
the ingress's one renderer (``_render.error_reply``) with the same status, headers, body
shape, metrics label and audit line.
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar
from litestar.exceptions import LitestarException

from gateway.ingress._context import Gateway
from gateway.ingress._dispatch import Exchange, serve
from gateway.ingress._render import error_reply
from gateway.ingress._reply import Reply, prepare
from gateway.providers import Protocol_
from gateway.usage import Endpoint


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
        ex = Exchange()
        error: BaseException | None = None
        try:
            gw: Gateway = scope["app"].state.gateway
            headers = _headers(scope)
            ex.trace = gw.telemetry.request(headers, self.endpoint)  # OFF: tracing off
            reply = await self._generate(gw, ex, headers, receive)
            asgi = prepare(reply)
        except Exception as exc:
            reply, error = self._error(scope, exc, ex), exc
            asgi = prepare(reply)
        try:
            await asgi(scope, receive, send)
        except Exception as exc:
            # As Litestar's exception middleware: once the head is out, the server closes
            # the connection (a stream's relay has already told the client in-band).
            error = exc
            raise LitestarException("Exception caught after response started") from exc
        finally:
            ex.trace.end(reply.status, error)  # the response is over, however it ended

    def _error(self, scope: Any, exc: Exception, ex: Exchange) -> Reply:
        return error_reply(
            getattr(scope["app"].state, "gateway", None), exc,
            anthropic=self.protocol == "anthropic", path=scope["path"],
            route=self.template, request_id=ex.request_id, principal=ex.principal,
            call=ex.call, user_agent=_headers(scope).get("user-agent"))

    async def _generate(self, gw: Gateway, ex: Exchange, headers: dict[str, str],
                        receive: Any) -> Reply:
        reply = await serve(gw, ex, self.endpoint, self.protocol, headers, receive)
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
