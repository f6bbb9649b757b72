"""What the cloud kinds (``azure``, ``vertex``) share: a bearer token from a source.

:class:`CloudProvider` is an :class:`~gateway.providers._http.HttpProvider` that, when it
has a token source (a :class:`~gateway.providers._credentials.CredentialSource` of access
tokens: ``_gcp.GcpTokens``, ``_entra.EntraTokens``), sends that source's current token as
``Authorization: Bearer`` — read before the request is written, so with no valid token
nothing is sent and the deployment answers 503 (``_credentials.unavailable_response``:
the next deployment is tried, nothing is charged, other providers never notice) — and
starts and stops the source with the provider. An error answer is read whole and passed
through :meth:`CloudProvider._error`: the cloud refusing the gateway's own credentials
(401/403) becomes the gateway's 500, never a 401 the client would take for its own key;
``_vertex`` also turns Google-shaped errors into Anthropic's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, ClassVar

import msgspec

from gateway.config import Credentials, ProviderSettings, StaticCredentials, resolve_secret
from gateway.errors import ConfigError
from gateway.providers._base import UpstreamResponse
from gateway.providers._credentials import (
    CredentialSource,
    CredentialsUnavailable,
    unavailable_response,
)
from gateway.providers._http import HttpProvider
from gateway.usage import Endpoint


def error_message(raw: bytes) -> str:
    """The message of an error body in Google's, OpenAI's/Azure's or Anthropic's shape
    (``{"error": {"message"}}``, Google's sometimes in a one-item list), else its start."""
    try:
        doc = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return raw[:200].decode("utf-8", "replace")
    if isinstance(doc, list) and doc:
        doc = doc[0]
    error = doc.get("error") if isinstance(doc, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message) if message is not None else raw[:200].decode("utf-8", "replace")


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


FIRST_TOKEN_WAIT_S = 10.0
"""How long start-up waits for a provider's first token (a token endpoint answers in well
under a second); past it the provider answers 503 until a retry gets one."""


class CloudProvider(HttpProvider):
    """An HTTP provider authenticated by a static header or a refreshed bearer token."""

    token_source: ClassVar[tuple[type[Credentials], Callable[..., CredentialSource[str]]]]
    """The credentials kind that makes a token source, and the source it makes (called
    with those credentials, ``provider=`` and ``where=``)."""
    credentials_needed: ClassVar[str]
    """The configuration error when the provider has neither a token source nor a static
    credential."""

    def __init__(self, settings: ProviderSettings, *, index: int = 0) -> None:
        super().__init__(settings, index=index)
        creds = settings.credentials
        kind, source = self.token_source
        self._tokens = (source(creds, provider=settings.name, where=self._where)
                        if isinstance(creds, kind) else None)
        self._static_ref, self._static_key = (
            (creds.ref, f"{self._where}.credentials.ref")
            if isinstance(creds, StaticCredentials)
            else (settings.api_key_ref, f"{self._where}.api_key_ref"))
        self._configure((settings.base_url or "").rstrip("/"))
        if self._tokens is None and self._static_ref is None:
            raise ConfigError(f"{self._where}.credentials: {self.credentials_needed}")

    def _configure(self, base: str) -> None:
        """Check the kind's own settings (``base``: the base URL, without a final ``/``)."""

    async def start(self) -> None:
        await super().start()
        if self._static_ref is not None:
            self._auth = self._static_header(resolve_secret(self._static_ref,
                                                            key=self._static_key))
        if self._tokens is not None:
            await self._tokens.start(wait_s=FIRST_TOKEN_WAIT_S)

    async def close(self) -> None:
        if self._tokens is not None:
            await self._tokens.close()
        await super().close()

    async def send(self, endpoint: Endpoint, body: bytes, *,
                   headers: dict[str, str]) -> UpstreamResponse:
        if self._tokens is not None:
            try:
                self._tokens.current()
            except CredentialsUnavailable as exc:  # nothing sent: this deployment's 503
                return unavailable_response(exc, provider=self.name)
        response = await super().send(endpoint, body, headers=headers)
        if response.status < 400:
            return response
        raw = await response.read()  # an error answer: small, read whole
        status, doc = self._error(response.status, raw)
        return replace(response, status=status, content_type="application/json",
                       chunks=_once(raw if doc is None else msgspec.json.encode(doc)))

    def _error(self, status: int, raw: bytes) -> tuple[int, dict[str, Any] | None]:
        """An upstream error as the client should see it: the cloud refusing the
        gateway's own credentials (401/403) is the gateway's failure, a 500 (definite:
        nothing ran; the next deployment is tried), never the client's 401; anything
        else as it came (``None``: the body unchanged)."""
        if status in (401, 403):
            return 500, self._error_doc("api_error", (
                f"provider {self.name} refused the gateway's credentials (HTTP {status}): "
                f"{error_message(raw)}"))
        return status, None

    def _error_doc(self, kind: str, message: str) -> dict[str, Any]:
        """An error body in the shape of the protocol this provider speaks."""
        return {"type": "error", "error": {"type": kind, "message": message}}

    def _static_header(self, secret: str) -> dict[str, str]:
        """How this cloud takes a static secret (Vertex: a bearer access token)."""
        return {"authorization": f"Bearer {secret}"}

    def _auth_headers(self) -> dict[str, str]:
        """The static header (``_auth``) or the current bearer token."""
        if self._tokens is None:
            return dict(self._auth)
        return {"authorization": f"Bearer {self._tokens.current()}"}

    @property
    def counts_tokens(self) -> bool:
        return False  # Azure has no count endpoint; vertex has its own
