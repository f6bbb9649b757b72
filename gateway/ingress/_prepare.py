"""Everything decided before admission: who, which body, which model, which bounds.

The token bound is conservative: every byte of the body may be an input token (no
tokenizer makes more tokens than bytes of text), and the output is what the request
allows (``max_tokens`` and its variants, times ``n`` choices) or the model's ceiling —
or, for a chat-completions or Responses request that names no limit, the operator's
opt-in cap (``default_output_tokens``, :func:`output_cap`), which the attempt writes
into the forwarded body (``gateway.ingress._attempt``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request
from litestar.exceptions import ClientException, InternalServerException

from gateway.config import Deployment, ModelSettings
from gateway.errors import (
    BadRequest,
    Forbidden,
    PayloadTooLarge,
    Unauthenticated,
    UnknownModel,
)
from gateway.identity import looks_like_jwt
from gateway.ingress._context import Gateway
from gateway.jsondepth import check_json_depth, too_deep_error
from gateway.keys import Principal, hash_key
from gateway.policy import routed_model
from gateway.providers import Protocol_, Provider
from gateway.usage import Endpoint

_OUTPUT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
_MAX_CHOICES = 128


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key in ``Authorization: Bearer`` or ``x-api-key`` (request headers, by their
    lower-case names, the first value of each)."""
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    return headers.get("x-api-key") or None


ACTING_FOR = "inferplane.acting_for"
"""The ASGI scope key of an in-process call made for a console session (:class:`ActingFor`)."""


@dataclass(frozen=True)
class ActingFor:
    """The credential an in-process call is made for, by its SHA-256 only.

    The console keeps no credential, only a session naming one by its digest; its calls
    to the API carry this in their ASGI scope (``scope[ACTING_FOR]``), which only code
    in this process builds (a client sets headers, never scope keys). The API checks it
    as it checks a presented credential: an admin token still configured, a key still
    valid."""

    credential_sha256: bytes


def presented(request: Request[Any, Any, Any]) -> str | ActingFor | None:
    """Who a request presents: the in-process :class:`ActingFor`, else its key or token."""
    acting = request.scope.get(ACTING_FOR)
    return acting if isinstance(acting, ActingFor) else presented_key(request.headers)


def presented_key_hash(headers: Mapping[str, str]) -> str:
    """SHA-256 of the presented key; 401 when none is presented."""
    key = presented_key(headers)
    if key is None:
        raise Unauthenticated("missing API key (Authorization: Bearer or x-api-key)")
    return hash_key(key)


async def credential_key_hash(gw: Gateway, headers: Mapping[str, str]) -> str:
    """The key hash a request is resolved by: a brokered gateway credential's (verified
    locally against inferplaned's keys, ``identity.broker``), else the presented key's
    SHA-256; 401 when none is presented or the credential is invalid."""
    key = presented_key(headers)
    if key is not None and gw.credentials is not None and looks_like_jwt(key):
        return await gw.credentials.key_hash(key)
    return presented_key_hash(headers)


async def authenticate(gw: Gateway, request: Request[Any, Any, Any]) -> Principal:
    who = presented(request)
    if isinstance(who, ActingFor):
        return await resolve_principal(gw, who.credential_sha256.hex())
    return await resolve_principal(gw, await credential_key_hash(gw, request.headers))


async def resolve_principal(gw: Gateway, key_hash: str) -> Principal:
    """The key's current Principal; 401 if unknown, revoked or expired."""
    return await gw.resolver.resolve(key_hash)


async def principal_to_admit(gw: Gateway, key_hash: str) -> Principal:
    """The Principal a request is planned with before its admission (cached where
    admission re-checks it: ``gateway.ingress._renew.Resolver.to_admit``)."""
    return await gw.resolver.to_admit(key_hash)


async def read_body(request: Request[Any, Any, Any], limit: int) -> bytes:
    """The body of a Litestar request, as :func:`receive_body` reads it."""
    return await receive_body(request.receive, request.headers, limit)


async def receive_body(receive: Any, headers: Mapping[str, str], limit: int) -> bytes:
    """The body from the raw ASGI ``receive``, refused with 413 as soon as it exceeds
    ``server.max_body_bytes``, with the refusals Litestar's request stream made (an
    unparsable ``content-length``: 400; a client gone mid-body: the 500 its
    ``InternalServerException`` became)."""
    declared = headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds "
                              f"server.max_body_bytes ({limit})")
    if declared is not None:
        try:
            int(declared)
        except ValueError:
            raise ClientException(f"Invalid content-length: {declared!r}") from None
    parts: list[bytes] = []
    size = 0
    while True:
        event = await receive()
        if event["type"] == "http.request":
            chunk = event["body"]
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(
                        f"request body exceeds server.max_body_bytes ({limit})")
                parts.append(chunk)
            if not event.get("more_body", False):
                break
        elif event["type"] == "http.disconnect":
            raise InternalServerException("client disconnected prematurely")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def parse_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; 400 if malformed or nested deeper than the limit
    (checked first, without recursing: ``gateway.jsondepth``)."""
    check_json_depth(body)
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # unreachable after the check; never a 500 if it is
        raise too_deep_error() from exc
    if not isinstance(doc, dict):
        raise BadRequest("request body must be a JSON object")
    return doc


@dataclass(frozen=True)
class Target:
    model: ModelSettings
    deployments: list[tuple[Deployment, Provider]]


def route(gw: Gateway, principal: Principal, doc: dict[str, Any],
          protocol: Protocol_) -> Target:
    name = doc.get("model")
    if not isinstance(name, str) or not name:
        raise BadRequest("model: required (a string)", param="model")
    model = gw.models.get(name)
    if model is None:
        raise UnknownModel(f"model {name!r} is not configured on this gateway", param="model")
    if not principal.may_use(name):
        raise Forbidden(f"this key may not use model {name!r}", param="model")
    model = routed_model(model, gw.policy.snapshot())  # a published RoutingPolicy, if any
    deployments = [(d, gw.providers[d.provider]) for d in model.deployments
                   if gw.providers[d.provider].speaks(protocol)]
    if not deployments:
        raise UnknownModel(f"model {name!r} has no {protocol}-compatible deployment",
                           param="model")
    return Target(model=model, deployments=deployments)


def _int_field(doc: dict[str, Any], name: str, *, ceiling: int) -> int | None:
    value = doc.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"{name}: must be a non-negative integer, got {value!r}", param=name)
    if value > ceiling:
        raise BadRequest(f"{name}: {value} exceeds this gateway's ceiling "
                         f"(server.max_output_tokens = {ceiling})", param=name)
    return value


CAPPED: tuple[Endpoint, ...] = ("chat", "responses")
"""Endpoints the output cap applies to: Anthropic's Messages API requires ``max_tokens``
on every request, so a Messages request always names its limit; embeddings make none."""


def output_cap(model: ModelSettings, deployment: Deployment) -> int | None:
    """The operator's output cap for requests to ``deployment`` that name no output
    limit (the deployment's ``default_output_tokens``, else the model's; None: off)."""
    cap = deployment.default_output_tokens
    return model.default_output_tokens if cap is None else cap


def names_output_limit(doc: dict[str, Any]) -> bool:
    """Whether the client named an output limit (any field :func:`output_bound` reads,
    not null): the cap never replaces one, so a smaller client limit always wins."""
    return any(doc.get(f) is not None for f in _OUTPUT_FIELDS)


def output_bound(doc: dict[str, Any], endpoint: Endpoint, model: ModelSettings, *,
                 ceiling: int) -> int:
    """The most output tokens this request can produce."""
    if endpoint == "embeddings":
        return 0
    asked = [v for f in _OUTPUT_FIELDS
             if (v := _int_field(doc, f, ceiling=ceiling)) is not None]
    per_choice = max(asked) if asked else model.max_output_tokens
    choices = 1
    if endpoint == "chat" and doc.get("n") is not None:
        n = doc["n"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= _MAX_CHOICES:
            raise BadRequest(f"n: must be an integer between 1 and {_MAX_CHOICES}", param="n")
        choices = n
    return per_choice * choices


def upstream_body(body: bytes, doc: dict[str, Any], deployment: Deployment,
                  endpoint: Endpoint, *, stream: bool) -> tuple[bytes, bool]:
    """The bytes to send upstream, and whether the usage-only chunk must be stripped.

    The body is forwarded verbatim unless the model name must change or a chat stream
    lacks ``stream_options.include_usage`` (added so the cost is known; the resulting
    usage-only chunk is stripped from what the client sees). Only then is it re-encoded.
    """
    changes: dict[str, Any] = {}
    if deployment.upstream_model and deployment.upstream_model != doc.get("model"):
        changes["model"] = deployment.upstream_model
    strip = False
    if endpoint == "chat" and stream:
        opts = doc.get("stream_options")
        if not (isinstance(opts, dict) and opts.get("include_usage") is True):
            changes["stream_options"] = {**(opts if isinstance(opts, dict) else {}),
                                         "include_usage": True}
            strip = True
    if not changes:
        return body, False
    return msgspec.json.encode({**doc, **changes}), strip


def wants_stream(doc: dict[str, Any], endpoint: Endpoint) -> bool:
    if endpoint == "embeddings":
        return False
    value = doc.get("stream", False)
    if not isinstance(value, bool):
        raise BadRequest("stream: must be a boolean", param="stream")
    return value
