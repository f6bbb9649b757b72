"""``azure`` provider kind: Azure OpenAI, for chat completions, Responses and embeddings.

Two URL forms, told apart by ``base_url`` (docs/azure.md):

- the v1 API, ``https://{resource}.openai.azure.com/openai/v1``: the OpenAI paths
  (``/chat/completions``, ``/responses``, ``/embeddings``) with the deployment name as
  the body's ``model``; ``api_version`` optional (``preview`` for preview features);
- the deployment form, ``https://{resource}.openai.azure.com/openai``:
  ``/deployments/{deployment}/chat/completions?api-version=…`` (and ``/embeddings``), the
  deployment being the body's ``model`` (the deployment's ``upstream_model``, else the
  gateway's model name); Responses is ``/responses?api-version=…`` with the model in the
  body; ``api_version`` required.

Authentication is ``api-key: <key>`` from ``api_key_ref`` (or ``credentials: {kind:
static}``), or an Entra ID access token (``Authorization: Bearer``) from ``credentials:
{kind: azure}`` (``gateway.providers._entra``, sent by ``_cloud.CloudProvider``), held in
memory and refreshed off the request path.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import msgspec

from gateway.config import AzureCredentials
from gateway.errors import ConfigError
from gateway.providers._base import with_trace
from gateway.providers._cloud import CloudProvider
from gateway.providers._entra import EntraTokens
from gateway.usage import Endpoint

_PATHS = {"chat": "/chat/completions", "responses": "/responses",
          "embeddings": "/embeddings"}


class _Model(msgspec.Struct):
    """The one field of a body the deployment form needs (decoded without the rest)."""

    model: str = ""


class AzureProvider(CloudProvider):
    """Azure OpenAI: OpenAI bodies verbatim, Azure's paths and authentication."""

    token_source = (AzureCredentials, EntraTokens)
    credentials_needed = ("an azure provider needs an api-key (api_key_ref, or "
                          "{kind: static}) or Entra ID credentials ({kind: azure})")

    def _configure(self, base: str) -> None:
        where, settings = self._where, self._settings
        if not base.startswith(("http://", "https://")) or not base.endswith(
                ("/openai", "/openai/v1")):
            raise ConfigError(f"{where}.base_url: an azure provider's base_url ends with "
                              "/openai/v1 (the v1 API) or /openai (the deployment form), "
                              f"got {settings.base_url!r}")
        self._v1 = base.endswith("/openai/v1")
        if not self._v1 and not settings.api_version:
            raise ConfigError(f"{where}.api_version: required by the deployment form "
                              f"(base_url {base!r} ends with /openai), e.g. 2024-10-21")
        version = settings.api_version
        self._query = f"?api-version={quote(version, safe='')}" if version else ""

    def speaks(self, protocol: str) -> bool:
        return protocol == "openai"

    def _static_header(self, secret: str) -> dict[str, str]:
        return {"api-key": secret}

    def _request(self, endpoint: Endpoint, body: bytes) -> tuple[str, bytes]:
        if self._v1 or endpoint == "responses":
            return _PATHS[endpoint] + self._query, body
        deployment = msgspec.json.decode(body, type=_Model).model
        return (f"/deployments/{quote(deployment, safe='')}{_PATHS[endpoint]}{self._query}",
                body)

    def _headers(self, client_headers: dict[str, str]) -> dict[str, str]:
        return with_trace(self._auth_headers(), client_headers)

    def _error_doc(self, kind: str, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}
