"""Entra ID (Azure AD) access tokens for ``azure`` providers, from azure-identity.

``credentials: {kind: azure}`` (``gateway.config.AzureCredentials``): with
``client_secret_ref``, client credentials (``ClientSecretCredential`` for ``tenant_id`` and
``client_id``, against ``authority_host``); otherwise a managed identity
(``ManagedIdentityCredential``: App Service / Container Apps / VM / Arc / AKS workload
identity, as azure-identity detects it; ``client_id`` picks a user-assigned identity).
The scope is Azure OpenAI's, ``https://cognitiveservices.azure.com/.default``.
azure-identity is synchronous here: each fetch runs in a thread, off the request path
(:class:`~gateway.providers._credentials.CredentialSource`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.config import AzureCredentials, resolve_secret
from gateway.errors import ConfigError
from gateway.providers._credentials import CredentialSource, Fetched


class EntraTokens(CredentialSource[str]):
    """An Entra ID access token for ``settings.scope``, refreshed before it expires."""

    def __init__(self, settings: AzureCredentials, *, provider: str, where: str) -> None:
        super().__init__(provider=provider)
        self._settings = settings
        self._where = where
        self._credential: Any = None
        if settings.client_secret_ref is not None:
            for name in ("tenant_id", "client_id"):
                if not getattr(settings, name):
                    raise ConfigError(f"{where}.credentials.{name}: required with "
                                      "client_secret_ref (client credentials)")

    async def fetch(self) -> Fetched[str]:
        return await asyncio.to_thread(self._fetch)

    def _build(self) -> Any:
        from azure.identity import ClientSecretCredential, ManagedIdentityCredential

        s = self._settings
        if s.client_secret_ref is None or s.tenant_id is None or s.client_id is None:
            return ManagedIdentityCredential(client_id=s.client_id)
        secret = resolve_secret(s.client_secret_ref,
                                key=f"{self._where}.credentials.client_secret_ref")
        extra: dict[str, Any] = {}
        if s.authority_host:
            # The named authority is trusted as given (a sovereign cloud, Azure Stack):
            # no instance discovery against login.microsoftonline.com.
            extra.update(authority=s.authority_host, disable_instance_discovery=True)
        return ClientSecretCredential(s.tenant_id, s.client_id, secret, **extra)

    def _fetch(self) -> Fetched[str]:
        if self._credential is None:
            self._credential = self._build()
        got = self._credential.get_token(self._settings.scope)
        return Fetched(str(got.token), float(got.expires_on))
