"""inferplaned's OpenAPI document, served as ``application/json`` at
``/v1alpha1/openapi.json`` without a token (it holds no data; docs/inferplaned.md, "API").

Litestar generates the paths and parameters from the handlers; what the handlers read by
hand is written in here: the request bodies (a GovernancePolicy document as JSON or YAML;
the heartbeat's :class:`gateway.lease.SyncRequest`, with its answer
:class:`gateway.lease.SyncResponse`) and the one error shape every route answers with
(``{"error": {"message", "problems"}}``, docs/inferplaned.md "Errors"), and a lease
plane's batch of usage records (:class:`gateway.lease.UsageBatch`, answered with
:class:`gateway.lease.UsageAck`). Every route but
the health probes takes a bearer token: a writer, reader or data plane token, by route.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
from litestar import Request
from litestar.enums import MediaType
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import OpenAPIRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme

from controlplane.credentials import CredentialRequest
from controlplane.keys import NewKey
from gateway.lease import SyncRequest, SyncResponse, UsageAck, UsageBatch
from gateway.providers import CredentialAnswer


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    """``<document>:<key path>`` of a refused document's problem."""
    message: str


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True):
    message: str
    problems: list[Problem]
    """Every problem of a refused document (422); empty otherwise."""


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """Every error inferplaned answers, on every route."""

    error: ErrorDetail


_REF = "#/components/schemas/{name}"
_OPEN = {"/healthz", "/readyz", "/v1alpha1/token", "/v1alpha1/jwks.json"}
"""No token: the health probes, the token exchange (its subject token authenticates) and
the credentials' public keys."""
_DOCUMENT = {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
             "description": "one GovernancePolicy document (docs/policy.md); "
                            "metadata.name must equal {name}"}


class _ReadByHand(NamedTuple):
    """A POST route whose handler reads its JSON body by hand, so Litestar cannot say it."""

    path: str
    body: str
    """The schema of the request body."""
    required: bool
    answer: tuple[str, str] | None = None
    """The 200 answer's description and schema (None: as Litestar generates it)."""


_READ_BY_HAND = (
    _ReadByHand("/v1alpha1/sync", "SyncRequest", True,
                ("the heartbeat's answer", "SyncResponse")),
    _ReadByHand("/v1alpha1/usage", "UsageBatch", True,
                ("which records are stored", "UsageAck")),
    _ReadByHand("/v1alpha1/credentials", "CredentialRequest", True,
                ("a short-lived cloud session", "CredentialAnswer")),
    _ReadByHand("/v1alpha1/teams/{team}/keys", "NewKey", False),
)


def _json(schema: str) -> dict[str, Any]:
    """A JSON content of the named schema."""
    return {"application/json": {"schema": {"$ref": _REF.format(name=schema)}}}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": _json("ErrorBody")}


def completed(document: dict[str, Any]) -> dict[str, Any]:
    """The generated document with the bodies the handlers read by hand, the error shape
    on every operation (4XX, 5XX) and no token asked by the health probes."""
    _, own = msgspec.json.schema_components((ErrorBody, SyncRequest, SyncResponse,
                                             CredentialRequest, CredentialAnswer,
                                             UsageBatch, UsageAck, NewKey),
                                            ref_template=_REF)
    document.setdefault("components", {}).setdefault("schemas", {}).update(own)
    paths: dict[str, dict[str, Any]] = document.get("paths", {})
    for path, item in paths.items():
        for operation in item.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            operation["responses"].update({"4XX": _error("refused (docs/inferplaned.md)"),
                                           "5XX": _error("the database is unavailable")})
            if path in _OPEN:
                operation["security"] = [{}]
    put = paths["/v1alpha1/policies/{name}"]["put"]
    put["requestBody"] = {"required": True, "content": {
        "application/json": {"schema": _DOCUMENT}, "application/yaml": {"schema": _DOCUMENT}}}
    for route in _READ_BY_HAND:
        operation = paths[route.path]["post"]
        operation["requestBody"] = {"required": route.required, "content": _json(route.body)}
        if route.answer is not None:
            description, schema = route.answer
            operation["responses"]["200"] = {"description": description,
                                             "content": _json(schema)}
    return document


class _Json(OpenAPIRenderPlugin):
    """Only the document itself, as JSON, at the config's own path (so Litestar's
    catch-all beside it sits under ``…/openapi.json/``, never over the API's 404s)."""

    def __init__(self) -> None:
        super().__init__(path="/", media_type=MediaType.JSON)

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return self.render_json(request, completed(openapi_schema))


OPENAPI = OpenAPIConfig(
    title="inferplaned API", version="v1alpha1",
    description="Policies published as numbered generations, and the lease profile's "
                "heartbeat (docs/inferplaned.md). Errors: {\"error\": {message, problems}}.",
    path="/v1alpha1/openapi.json", render_plugins=[_Json()], use_handler_docstrings=True,
    security=[{"bearer": []}],
    components=Components(security_schemes={"bearer": SecurityScheme(
        type="http", scheme="bearer",
        description="a writer or reader token (auth.writer_tokens_ref, "
                    "auth.reader_tokens_ref), or a data plane token on /v1alpha1/sync "
                    "and /v1alpha1/usage")}))

__all__ = ["OPENAPI", "completed"]
