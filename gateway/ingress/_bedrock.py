"""Bedrock's runtime paths as an ingress: ``POST /bedrock/model/{modelId}/invoke`` and
``/invoke-with-response-stream``, what Claude Code (``CLAUDE_CODE_USE_BEDROCK=1`` with
``ANTHROPIC_BEDROCK_BASE_URL=<gateway>/bedrock``) and the anthropic SDK's
``AnthropicBedrock`` send.

A Bedrock request is an Anthropic Messages request in other clothes, so it runs the
Messages path unchanged (authenticate, bound, admit, dispatch, settle:
``gateway.ingress._dispatch.serve``) on the body it becomes (:func:`messages_body`): the
model from the path (:func:`model_name` maps a Bedrock model or inference-profile id to a
configured model), ``stream`` from the operation, ``anthropic_version`` dropped and
``anthropic_beta`` moved to the ``anthropic-beta`` header. It is routed to any deployment
that speaks Messages (``anthropic``, ``bedrock``, the mock). Our key travels as
``Authorization: Bearer`` (Claude Code's ``AWS_BEARER_TOKEN_BEDROCK``, a Bedrock API key's
own header) or ``x-api-key`` (``ANTHROPIC_CUSTOM_HEADERS``); a SigV4 ``Authorization``
header is not our key and is refused as a missing one.

The answer is in Bedrock's framing: a message as JSON; a stream as AWS event-stream
``chunk`` messages, one per Anthropic event as it is relayed, an in-stream error as an
``exception`` message; an error as ``{"message"}`` with ``x-amzn-errortype`` (the
Anthropic body's ``type`` and ``error`` kept beside it, so either SDK reads it).
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import msgspec

from gateway.errors import BadRequest, NotFound
from gateway.ingress._context import Gateway
from gateway.ingress._dispatch import Exchange, serve
from gateway.ingress._prepare import parse_json, receive_body
from gateway.ingress._render import error_reply
from gateway.ingress._reply import Reply, prepare
from gateway.providers import EVENTSTREAM_TYPE, chunk_message, exception_message

TEMPLATES = ("/bedrock/model/{modelId}/invoke",
             "/bedrock/model/{modelId}/invoke-with-response-stream")
_PATH = re.compile(r"^/bedrock/model/([^/]+)/(invoke|invoke-with-response-stream)$")
_PROFILE = re.compile(r"^(?:us|eu|apac|jp|au|ca|us-gov|global)\.")
_EVENT_END = re.compile(rb"\r?\n\r?\n")

# The gateway's status → the exception type Bedrock names for it.
_ERROR_TYPES = {400: "ValidationException", 401: "UnrecognizedClientException",
                402: "ServiceQuotaExceededException", 403: "AccessDeniedException",
                404: "ResourceNotFoundException", 408: "ModelTimeoutException",
                413: "ValidationException", 429: "ThrottlingException",
                503: "ServiceUnavailableException", 529: "ServiceUnavailableException"}


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in scope["headers"]:
        out.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return out


def model_name(gw: Gateway, model_id: str) -> str:
    """The configured model a Bedrock model id names: the id itself; else a model with a
    deployment sending that id upstream; else the id without its inference-profile
    prefix (``us.``), ``anthropic.`` and version suffix (``-v1:0``), so
    ``us.anthropic.claude-sonnet-4-5-20250929-v1:0`` finds ``claude-sonnet-4-5-20250929``.
    An unknown id stays as it is (the router's 404 names it)."""
    if model_id in gw.models:
        return model_id
    for name, model in gw.models.items():
        if any(d.upstream_model == model_id for d in model.deployments):
            return name
    bare = re.sub(r"-v\d+(?::\d+)?$", "", _PROFILE.sub("", model_id).removeprefix("anthropic."))
    return bare if bare in gw.models else model_id


def messages_body(doc: dict[str, Any], *, model: str, stream: bool
                  ) -> tuple[bytes, str | None]:
    """(the Messages body, the ``anthropic-beta`` header) of a Bedrock body."""
    for field in ("model", "stream"):
        if field in doc:
            raise BadRequest(f"{field}: extraneous key [{field}] is not permitted (the "
                             "model is in the path, streaming is the operation)", param=field)
    doc.pop("anthropic_version", None)
    beta = doc.pop("anthropic_beta", None)
    if beta is not None and not (isinstance(beta, list)
                                 and all(isinstance(b, str) for b in beta)):
        raise BadRequest("anthropic_beta: must be an array of strings", param="anthropic_beta")
    body = msgspec.json.encode({"model": model, **doc, **({"stream": True} if stream else {})})
    return body, ",".join(beta) if beta else None


def _replay(body: bytes) -> Any:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}
    return receive


def bedrock_error(reply: Reply) -> Reply:
    """An Anthropic-shaped error answer in Bedrock's shape (module docstring)."""
    doc = msgspec.json.decode(reply.body) if reply.body else {}
    message = (doc.get("error") or {}).get("message", "") if isinstance(doc, dict) else ""
    kind = _ERROR_TYPES.get(reply.status, "InternalServerException")
    body = msgspec.json.encode({"message": message, **(doc if isinstance(doc, dict) else {})})
    return Reply(reply.status, {**reply.headers, "x-amzn-errortype": kind},
                 reply.media_type, body)


async def event_stream(sse: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """Anthropic SSE events as event-stream messages, each sent as it is complete."""
    pending = b""
    async for chunk in sse:
        pending += chunk
        frames: list[bytes] = []
        while (end := _EVENT_END.search(pending)) is not None:
            event, pending = pending[:end.start()], pending[end.end():]
            frames.append(_frame(event))
        if frames:
            yield b"".join(frames)
    if pending.strip():
        yield _frame(pending)


def _frame(event: bytes) -> bytes:
    data = b"\n".join(line[5:].removeprefix(b" ") for line in event.splitlines()
                      if line.startswith(b"data:"))
    doc = msgspec.json.decode(data)
    if isinstance(doc, dict) and doc.get("type") == "error":
        error = doc.get("error") or {}
        kind = ("throttlingException" if error.get("type") == "rate_limit_error"
                else "modelStreamErrorException")
        return exception_message(kind, str(error.get("message", "")))
    return chunk_message(data)


class BedrockInvoke:
    """Both Bedrock operations as one ASGI app (below Litestar, as the other routes)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        ex = Exchange()
        match = _PATH.match(scope["path"])
        template = TEMPLATES[1 if match and match.group(2) != "invoke" else 0]
        gw: Gateway | None = getattr(scope["app"].state, "gateway", None)
        headers = _headers(scope)
        try:
            if match is None or gw is None:
                raise NotFound(f"no Bedrock operation at {scope['path']}")
            reply = await self._invoke(gw, ex, headers, receive, match.group(1),
                                       stream=match.group(2) != "invoke")
            gw.metrics.request_done(template, reply.status)
        except Exception as exc:
            reply = error_reply(gw, exc, anthropic=True, path=scope["path"], route=template,
                                request_id=ex.request_id, principal=ex.principal,
                                call=ex.call, user_agent=headers.get("user-agent"))
        if reply.status >= 400 and reply.stream is None:
            reply = bedrock_error(reply)
        await prepare(reply)(scope, receive, send)

    async def _invoke(self, gw: Gateway, ex: Exchange, headers: dict[str, str], receive: Any,
                      model_id: str, *, stream: bool) -> Reply:
        raw = await receive_body(receive, headers, gw.settings.server.max_body_bytes)
        body, beta = messages_body(parse_json(raw), model=model_name(gw, model_id),
                                   stream=stream)
        inner = {k: v for k, v in headers.items() if k != "content-length"}
        if beta:  # Claude Code sends betas in both: the header's first, then the body's
            inner["anthropic-beta"] = ",".join(b for b in (headers.get("anthropic-beta"), beta)
                                               if b)
        reply = await serve(gw, ex, "messages", "anthropic", inner, _replay(body))
        if reply.stream is None or reply.status != 200:
            return reply
        return Reply(200, {k: v for k, v in reply.headers.items()
                           if k not in ("cache-control",)},
                     EVENTSTREAM_TYPE, stream=event_stream(reply.stream), after=reply.after,
                     hangup=reply.hangup)


BEDROCK = BedrockInvoke()
