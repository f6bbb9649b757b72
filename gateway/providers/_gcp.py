"""Google OAuth2 access tokens for ``vertex`` providers, from google-auth.

``credentials: {kind: gcp}`` (``gateway.config.GcpCredentials``): a service-account key
file (``service_account_file``), else application default credentials as google-auth
finds them (``GOOGLE_APPLICATION_CREDENTIALS`` — a key file or an external-account /
workload-identity-federation file —, gcloud's user credentials, the metadata server of
GKE workload identity or a Compute Engine VM). google-auth does the token exchange (a
signed JWT to the key's ``token_uri``, an STS exchange, the metadata server); this
module only runs it in a thread and hands the token to the refresher
(:class:`~gateway.providers._credentials.CredentialSource`).
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC
from typing import Any

from gateway.config import GcpCredentials
from gateway.errors import ConfigError
from gateway.providers._credentials import CredentialSource, Fetched


class GcpTokens(CredentialSource[str]):
    """An access token for ``scopes``, refreshed before it expires."""

    def __init__(self, settings: GcpCredentials, *, provider: str,
                 where: str = "providers[?]") -> None:
        super().__init__(provider=provider)
        self._settings = settings
        path = settings.service_account_file
        if path is not None and not os.access(path, os.R_OK):
            # A missing key file is a config mistake, said at start-up with its key.
            raise ConfigError(f"{where}.credentials.service_account_file: {path!r} is not "
                              "a readable file")
        self._creds: Any = None
        """google-auth's credentials object, built on the first fetch (it reads files)."""

    async def fetch(self) -> Fetched[str]:
        return await asyncio.to_thread(self._fetch)

    def _fetch(self) -> Fetched[str]:
        import google.auth
        import google.auth.transport.requests
        from google.oauth2 import service_account

        s = self._settings
        if self._creds is None:
            if s.service_account_file:
                load: Any = service_account.Credentials.from_service_account_file  # untyped
                self._creds = load(s.service_account_file, scopes=s.scopes)
            else:
                self._creds, _ = google.auth.default(scopes=s.scopes)
        self._creds.refresh(google.auth.transport.requests.Request())
        expiry = self._creds.expiry  # naive UTC (google-auth's convention)
        return Fetched(str(self._creds.token),
                       expiry.replace(tzinfo=UTC).timestamp() if expiry else None)
