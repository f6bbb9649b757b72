"""``vertex`` provider kind: Anthropic's models on Google Vertex AI (``rawPredict``).

``base_url`` names the project and region:
``https://{region}-aiplatform.googleapis.com/v1/projects/{project}/locations/{region}``
(``https://aiplatform.googleapis.com/v1/projects/{project}/locations/global`` for the
global endpoint). A Messages request goes to
``/publishers/anthropic/models/{model}:rawPredict`` (``:streamRawPredict`` when it
streams) with its body as Anthropic's, ``model`` moved into the path and
``anthropic_version: vertex-2023-10-16`` added; ``anthropic-beta`` travels as a header.
Responses are Anthropic's own (JSON or SSE), so usage is metered as for ``anthropic``;
Vertex's own errors (Google's shape: quota, an unknown model) are turned into Anthropic's
with their status, and Google refusing the gateway's token into a 500 of the gateway's.

Authentication: an OAuth2 access token (``Authorization: Bearer``) from google-auth
(``credentials``: a service-account key file, or application default credentials —
workload identity, an external account), refreshed off the request path
(``gateway.providers._credentials``); or, for tests and short runs, a static token by reference
(``api_key_ref``).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import msgspec

from gateway.config import GcpCredentials
from gateway.errors import ConfigError
from gateway.providers._base import with_trace
from gateway.providers._cloud import CloudProvider, error_message
from gateway.providers._count import CountFailed
from gateway.providers._credentials import CredentialsUnavailable
from gateway.providers._gcp import GcpTokens
from gateway.usage import Endpoint

VERTEX_VERSION = "vertex-2023-10-16"
"""The ``anthropic_version`` Vertex AI requires in the body."""
COUNT_PATH = "/publishers/anthropic/models/count-tokens:rawPredict"
"""Vertex's token count for Claude (the model in the body): what refines the input bound
as Anthropic's ``count_tokens`` does (docs/bounds.md)."""

_GOOGLE_KINDS = {400: "invalid_request_error", 404: "not_found_error",
                 429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error"}
"""Google's statuses (``INVALID_ARGUMENT``, ``NOT_FOUND``, ``RESOURCE_EXHAUSTED``,
``UNAVAILABLE``, ``DEADLINE_EXCEEDED``) as Anthropic's error types."""


def _google_shaped(raw: bytes) -> bool:
    """``{"error": {"code", "status", "message"}}`` (or a list of one), not Anthropic's."""
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return False
    if isinstance(doc, list) and doc:
        doc = doc[0]
    return (isinstance(doc, dict) and doc.get("type") != "error"
            and isinstance(doc.get("error"), dict) and "status" in doc["error"])


_BASE = re.compile(r"https?://[^/]+/v1(beta1)?/projects/[^/]+/locations/[^/]+")


class VertexProvider(CloudProvider):
    """Vertex AI's Anthropic publisher endpoint: Anthropic bodies, Google's auth."""

    token_source = (GcpCredentials, GcpTokens)
    credentials_needed = ("a vertex provider needs Google credentials ({kind: gcp}) or a "
                          "static access token (api_key_ref, or {kind: static})")

    def _configure(self, base: str) -> None:
        if not _BASE.fullmatch(base):
            raise ConfigError(
                f"{self._where}.base_url: a vertex provider's base_url is "
                "https://{region}-aiplatform.googleapis.com/v1/projects/{project}/"
                f"locations/{{region}}, got {self._settings.base_url!r}")

    def speaks(self, protocol: str) -> bool:
        return protocol == "anthropic"

    def _request(self, endpoint: Endpoint, body: bytes) -> tuple[str, bytes]:
        doc: dict[str, Any] = msgspec.json.decode(body)
        model = doc.pop("model", "")
        doc["anthropic_version"] = VERTEX_VERSION
        verb = "streamRawPredict" if doc.get("stream") is True else "rawPredict"
        return (f"/publishers/anthropic/models/{quote(str(model), safe='@')}:{verb}",
                msgspec.json.encode(doc))

    def _error(self, status: int, raw: bytes) -> tuple[int, dict[str, Any] | None]:
        """Vertex's own errors (Google's shape: quota, an unknown model, an overloaded
        region) in Anthropic's, with their status; Anthropic's errors pass as they are."""
        mapped = super()._error(status, raw)
        if mapped[1] is not None or not _google_shaped(raw):
            return mapped
        kind = _GOOGLE_KINDS.get(status, "api_error")
        return status, self._error_doc(kind, f"Vertex AI: {error_message(raw)}")

    @property
    def counts_tokens(self) -> bool:
        return True

    def _count_request(self, body: bytes) -> tuple[str, bytes]:
        """Vertex's count: ``count-tokens:rawPredict``, the model in the body."""
        doc: dict[str, Any] = msgspec.json.decode(body)
        doc["anthropic_version"] = VERTEX_VERSION
        return COUNT_PATH, msgspec.json.encode(doc)

    async def count_input_tokens(self, body: bytes, *, headers: dict[str, str]) -> int:
        if self._tokens is not None:
            try:
                self._tokens.current()
            except CredentialsUnavailable as exc:  # no count: the byte bound stands
                raise CountFailed(f"{self.name}: count_tokens: {exc}") from exc
        return await super().count_input_tokens(body, headers=headers)

    def _headers(self, client_headers: dict[str, str]) -> dict[str, str]:
        headers = self._auth_headers()
        if "anthropic-beta" in client_headers:
            headers["anthropic-beta"] = client_headers["anthropic-beta"]
        return with_trace(headers, client_headers)
