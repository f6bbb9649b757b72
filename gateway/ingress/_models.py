"""``GET /v1/models/{id}``: one model, in the calling SDK's own shape.

Anthropic's SDK sends ``anthropic-version`` (and its key as ``x-api-key``); OpenAI's sends
neither. The answer follows: Anthropic's ``{"type": "model", "id", "display_name",
"created_at", ...}`` or OpenAI's ``{"id", "object": "model", "created", "owned_by"}``,
and so does the 404 for a model that is not configured or that this key may not use
(one answer for both, so a key cannot probe which models exist).
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from litestar import Request, get
from litestar.params import FromPath

from gateway.catalog import CatalogModel, builtin_catalog
from gateway.config import ModelSettings
from gateway.errors import UnknownModel
from gateway.ingress._context import Gateway
from gateway.ingress._prepare import authenticate

_EPOCH = "1970-01-01T00:00:00Z"
"""Release dates are the provider's to state; the epoch says "unknown" (as Anthropic's
SDK documents for ``created_at``)."""


def anthropic_client(request: Request[Any, Any, Any]) -> bool:
    """A request from an Anthropic-protocol client (SDK or Claude Code)."""
    return "anthropic-version" in request.headers or "x-api-key" in request.headers


def _utc(day: date | None) -> str | None:
    if day is None:
        return None
    return datetime(day.year, day.month, day.day, tzinfo=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _anthropic(model: ModelSettings, entry: CatalogModel | None) -> dict[str, Any]:
    retires = entry.retires if entry else None
    return {"type": "model", "id": model.name, "display_name": model.name,
            "created_at": _EPOCH,
            "lifecycle": "deprecated" if entry and entry.status == "deprecated" else "active",
            "retires_at": _utc(retires),
            "max_input_tokens": model.max_input_tokens,
            "max_tokens": model.max_output_tokens}


def _openai(model: ModelSettings, entry: CatalogModel | None) -> dict[str, Any]:
    body: dict[str, Any] = {"id": model.name, "object": "model", "created": 0,
                            "owned_by": "inferplane"}
    if entry and entry.retires:
        body["shutdown_date"] = entry.retires.isoformat()
    return body


@get("/v1/models/{model_id:path}", include_in_schema=False)
async def retrieve_model(request: Request[Any, Any, Any],
                         model_id: FromPath[str]) -> dict[str, Any]:
    """A configured model this key may use; 404 (the caller's shape) otherwise."""
    gw: Gateway = request.app.state.gateway
    principal = await authenticate(gw, request)
    name = model_id.lstrip("/")
    model = gw.models.get(name)
    if model is None or not principal.may_use(name):
        raise UnknownModel(f"model {name!r} not found on this gateway for this key",
                           param="model")
    entry = builtin_catalog().get(model.catalog or model.name)
    return _anthropic(model, entry) if anthropic_client(request) else _openai(model, entry)
