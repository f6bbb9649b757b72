"""Upstream providers: ``openai`` (any OpenAI-compatible URL), ``anthropic``, ``mock``."""

from gateway.config import ProviderSettings
from gateway.providers._base import (
    RETRYABLE_STATUS,
    DispatchFailed,
    NotDispatched,
    Protocol_,
    Provider,
    UpstreamFailure,
    UpstreamResponse,
)
from gateway.providers._count import CountFailed, TokenCounter, count_body
from gateway.providers._http import HttpProvider
from gateway.providers._mock import MockProvider


def build_providers(settings: list[ProviderSettings]) -> dict[str, Provider]:
    """One provider object (and, for HTTP kinds, one pooled client) per configured name."""
    built: dict[str, Provider] = {}
    for i, p in enumerate(settings):
        built[p.name] = MockProvider(p) if p.kind == "mock" else HttpProvider(p, index=i)
    return built


__all__ = [
    "RETRYABLE_STATUS",
    "CountFailed",
    "DispatchFailed",
    "HttpProvider",
    "MockProvider",
    "NotDispatched",
    "Protocol_",
    "Provider",
    "UpstreamFailure",
    "TokenCounter",
    "UpstreamResponse",
    "build_providers",
    "count_body",
]
