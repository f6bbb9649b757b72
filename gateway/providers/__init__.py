"""Upstream providers: ``openai`` (any OpenAI-compatible URL), ``anthropic``, ``mock``,
and the clouds' ``bedrock`` (Claude on Amazon Bedrock), ``azure`` (Azure OpenAI) and
``vertex`` (Claude on Vertex AI)."""

from gateway.config import ProviderSettings
from gateway.providers._azure import AzureProvider
from gateway.providers._base import (
    RETRYABLE_STATUS,
    DispatchFailed,
    NotDispatched,
    Protocol_,
    Provider,
    UpstreamFailure,
    UpstreamResponse,
)
from gateway.providers._bedrock import BedrockProvider
from gateway.providers._count import CountFailed, TokenCounter, count_body
from gateway.providers._credentials import (
    CredentialAnswer,
    CredentialSource,
    CredentialsUnavailable,
    Fetched,
    fetch_aws,
)
from gateway.providers._eventstream import CONTENT_TYPE as EVENTSTREAM_TYPE
from gateway.providers._eventstream import chunk_message, exception_message
from gateway.providers._http import HttpProvider
from gateway.providers._mock import MockProvider
from gateway.providers._vertex import VertexProvider

_OWN: dict[str, type[BedrockProvider]] = {"bedrock": BedrockProvider}
"""Kinds that are not HTTP subclasses (their own request and answer shapes)."""
_KINDS: dict[str, type[HttpProvider]] = {"azure": AzureProvider, "vertex": VertexProvider}
"""HTTP kinds with their own class (the rest: ``HttpProvider``)."""


def build_providers(settings: list[ProviderSettings]) -> dict[str, Provider]:
    """One provider object (and, for HTTP kinds, one pooled client) per configured name."""
    built: dict[str, Provider] = {}
    for i, p in enumerate(settings):
        if p.kind in _OWN:
            built[p.name] = _OWN[p.kind](p, index=i)
            continue
        built[p.name] = (MockProvider(p) if p.kind == "mock"
                         else _KINDS.get(p.kind, HttpProvider)(p, index=i))
    return built


__all__ = [
    "CredentialAnswer",
    "EVENTSTREAM_TYPE",
    "RETRYABLE_STATUS",
    "BedrockProvider",
    "CredentialSource",
    "CredentialsUnavailable",
    "Fetched",
    "chunk_message",
    "exception_message",
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
    "fetch_aws",
]
