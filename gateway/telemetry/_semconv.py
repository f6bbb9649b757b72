"""What a request's spans say, as OpenTelemetry attributes: pure functions, no I/O.

We follow the GenAI semantic conventions of OpenTelemetry semantic-conventions
**v1.44.0** (``SEMCONV_VERSION``; the GenAI conventions are still "Development" there,
so names may change in a later release and this module is the one place to follow
them). Where they name nothing (admission, settlement, money) the attributes live under
``inferplane.*``.
"""

from __future__ import annotations

from typing import Any

SEMCONV_VERSION = "1.44.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

_PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "bedrock": "aws.bedrock",
              "vertex": "gcp.vertex_ai", "azure": "azure.ai.openai"}
"""A deployment's provider kind → ``gen_ai.provider.name`` (the convention's values)."""

_OPERATIONS = {"chat": "chat", "messages": "chat", "responses": "chat",
               "embeddings": "embeddings"}
"""An ingress endpoint → ``gen_ai.operation.name``."""


def provider_name(kind: str) -> str:
    """``gen_ai.provider.name`` for a provider kind (``mock`` and others as they are)."""
    return _PROVIDERS.get(kind, kind)


def operation_name(endpoint: str) -> str:
    return _OPERATIONS.get(endpoint, endpoint)


def span_name(operation: str, model: str | None) -> str:
    """The convention's ``{gen_ai.operation.name} {gen_ai.request.model}``."""
    return f"{operation} {model}" if model else operation


def usage_attributes(usage: Any) -> dict[str, int]:
    """A :class:`gateway.pricing.Usage` as ``gen_ai.usage.*``. The convention's input
    count includes the cached classes (ours excludes them: their sum is its figure)."""
    writes = usage.cache_write_5m + usage.cache_write_1h + usage.cache_write_unknown
    return {"gen_ai.usage.input_tokens": usage.input + usage.cache_read + writes,
            "gen_ai.usage.output_tokens": usage.output,
            "gen_ai.usage.cache_read.input_tokens": usage.cache_read,
            "gen_ai.usage.cache_creation.input_tokens": writes}


def settlement_attributes(settlement: Any) -> dict[str, Any]:
    """One settlement's figures (µUSD as integers, the outcome kind)."""
    out: dict[str, Any] = {"inferplane.outcome": str(settlement.kind),
                           "inferplane.committed_uusd": settlement.usd_committed,
                           "inferplane.liability_uusd": settlement.usd_liability,
                           "inferplane.tokens_committed": settlement.tokens_committed}
    if settlement.usage is not None:
        out.update(usage_attributes(settlement.usage))
    return out


def principal_attributes(principal: Any) -> dict[str, str]:
    """Who asked: ids only (a user is the key's own ``user`` field, set by the admin)."""
    out = {"inferplane.team": principal.team_id, "inferplane.key_id": principal.key_id}
    if principal.user:
        out["inferplane.user"] = str(principal.user)
    return out


def server_attributes(base_url: str | None) -> dict[str, Any]:
    """``server.address`` / ``server.port`` of an upstream's base URL."""
    if not base_url:
        return {}
    from urllib.parse import urlsplit

    parts = urlsplit(base_url)
    if not parts.hostname:
        return {}
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {"server.address": parts.hostname, "server.port": port}


def error_type(exc: BaseException | None, status: int | None = None) -> str | None:
    """``error.type``: the error's class (ours carry a stable ``code``), else the HTTP
    status of a failed answer; None for a success."""
    if exc is not None:
        code = getattr(exc, "code", None)
        return code if isinstance(code, str) and code else type(exc).__qualname__
    if status is not None and status >= 400:
        return str(status)
    return None
