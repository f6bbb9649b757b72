"""Vertex AI's Anthropic paths as an ingress: ``POST /v1/projects/{p}/locations/{r}/
publishers/anthropic/models/{model}:rawPredict`` and ``:streamRawPredict``, what Claude
Code (``CLAUDE_CODE_USE_VERTEX=1`` with ``ANTHROPIC_VERTEX_BASE_URL=<gateway>/v1`` and
``CLAUDE_CODE_SKIP_VERTEX_AUTH=1``) and the anthropic SDK's ``AnthropicVertex`` send.

A Vertex request is an Anthropic Messages request with the model in the path and
``anthropic_version`` (``vertex-2023-10-16``) in the body, so it runs the Messages path
unchanged (authenticate, bound, admit, dispatch, settle: ``gateway.ingress._dispatch.
serve``) on the body it becomes (:func:`messages_body`): ``model`` from the path
(:func:`model_name`), ``anthropic_version`` dropped, ``stream: true`` for
``:streamRawPredict``; ``anthropic-beta`` stays a header, as Vertex takes it. It is routed
to any deployment that speaks Messages (``anthropic``, ``vertex``, ``bedrock``, the
mock), and answered as Vertex answers: Anthropic's own JSON or SSE. Project and region in
the path are the client's settings, not a choice of upstream. Our key travels as
``Authorization: Bearer`` (``AnthropicVertex(access_token=…)``, or Claude Code's
``ANTHROPIC_CUSTOM_HEADERS`` / ``apiKeyHelper``) or ``x-api-key``.

``…/models/count-tokens:rawPredict`` (Vertex's token count; the model in the body) is
answered locally with the deterministic estimate, as ``/v1/messages/count_tokens``.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from gateway.errors import BadRequest, NotFound
from gateway.ingress._asgi import _headers as request_headers  # the ingress's one reader
from gateway.ingress._context import Gateway
from gateway.ingress._dispatch import Exchange, serve
from gateway.ingress._prepare import (
    parse_json,
    presented_key_hash,
    receive_body,
    resolve_principal,
    route,
)
from gateway.ingress._render import error_reply
from gateway.ingress._reply import Reply, prepare
from gateway.usage import estimate_tokens, prompt_text

TEMPLATE = ("/v1/projects/{project}/locations/{region}/publishers/anthropic/models/"
            "{model}:{method}")
_PATH = re.compile(r"^/v1(?:beta1)?/projects/[^/]+/locations/[^/]+/publishers/anthropic/"
                   r"models/([^/:]+):(rawPredict|streamRawPredict)$")


def model_name(gw: Gateway, model_id: str) -> str:
    """The configured model a Vertex model id names: the id itself; else a model with a
    deployment sending that id upstream; else the id with its ``@`` version separator as
    Anthropic spells it (``claude-sonnet-4-5@20250929`` finds
    ``claude-sonnet-4-5-20250929``). An unknown id stays (the router's 404 names it)."""
    if model_id in gw.models:
        return model_id
    for name, model in gw.models.items():
        if any(d.upstream_model == model_id for d in model.deployments):
            return name
    dashed = model_id.replace("@", "-")
    return dashed if dashed in gw.models else model_id


def messages_body(doc: dict[str, Any], *, model: str, stream: bool) -> bytes:
    """The Messages body of a Vertex ``rawPredict`` body."""
    # Whatever Vertex version the client names (vertex-2023-10-16; newer SDKs send their
    # own API version): the deployment's provider sends what its upstream takes.
    version = doc.pop("anthropic_version", None)
    if version is not None and not isinstance(version, str):
        raise BadRequest("anthropic_version: must be a string", param="anthropic_version")
    if "model" in doc:
        raise BadRequest("model: Extra inputs are not permitted (the model is in the path)",
                         param="model")
    return msgspec.json.encode({"model": model, **doc, **({"stream": True} if stream else {})})


def _replay(body: bytes) -> Any:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}
    return receive


class VertexPredict:
    """Both Vertex methods (and the count) as one ASGI app (below Litestar, as the other
    generation routes); errors in Anthropic's shape, as Vertex's publisher endpoint
    answers them."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        ex = Exchange()
        gw: Gateway | None = getattr(scope["app"].state, "gateway", None)
        headers = request_headers(scope)
        try:
            match = _PATH.match(scope["path"])
            if match is None or gw is None:
                raise NotFound(f"no Vertex method at {scope['path']}")
            reply = await _predict(gw, ex, headers, receive, *match.groups())
            gw.metrics.request_done(TEMPLATE, reply.status)
        except Exception as exc:
            reply = error_reply(gw, exc, anthropic=True, path=scope["path"], route=TEMPLATE,
                                request_id=ex.request_id, principal=ex.principal,
                                call=ex.call, user_agent=headers.get("user-agent"))
        await prepare(reply)(scope, receive, send)


async def _predict(gw: Gateway, ex: Exchange, headers: dict[str, str], receive: Any,
                   model_id: str, method: str) -> Reply:
    raw = await receive_body(receive, headers, gw.settings.server.max_body_bytes)
    if model_id == "count-tokens":
        return await _count(gw, headers, raw)
    body = messages_body(parse_json(raw), model=model_name(gw, model_id),
                         stream=method == "streamRawPredict")
    inner = {k: v for k, v in headers.items() if k != "content-length"}
    return await serve(gw, ex, "messages", "anthropic", inner, _replay(body))


async def _count(gw: Gateway, headers: dict[str, str], raw: bytes) -> Reply:
    """Vertex's ``count-tokens:rawPredict``: the local estimate, no provider call."""
    principal = await resolve_principal(gw, presented_key_hash(headers))
    doc = parse_json(raw)
    doc.pop("anthropic_version", None)
    if isinstance(doc.get("model"), str):
        doc["model"] = model_name(gw, doc["model"])
    route(gw, principal, doc, "anthropic")
    body = msgspec.json.encode({"input_tokens": estimate_tokens(prompt_text(doc))})
    return Reply(200, {}, "application/json", body)


VERTEX = VertexPredict()
