"""One issuer's signing keys: discovery, the JWKS fetched and cached, refreshed on an
unknown ``kid`` at a bounded rate.

A token naming a ``kid`` the cache does not hold refetches the JWKS at most once per
``jwks_min_refresh_s`` (a flood of made-up ``kid``s costs the issuer one fetch per
interval, not one per token); the set is also refetched when older than
``jwks_max_age_s``, so a key the issuer retired stops verifying within that age.
Fetches are single-flighted: concurrent misses share one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.identity._settings import IssuerSettings

log = logging.getLogger("mayu.identity")


@dataclass(frozen=True)
class PublicKey:
    """A published signing key: the key object PyJWT verifies with, and the ``alg`` the
    JWK declares (None: the JWK leaves it to the token's header)."""

    key: Any
    alg: str | None


class JwksUnavailable(Exception):
    """The issuer's discovery document or JWKS could not be fetched or read."""


class JwksCache:
    """The keys of one issuer, by ``kid`` (only keys usable for signatures)."""

    def __init__(self, settings: IssuerSettings, *,
                 client: httpx.AsyncClient | None = None) -> None:
        self.settings = settings
        self._client = client
        self._keys: dict[str, PublicKey] = {}
        self._fetched_at: float | None = None
        self._jwks_url = settings.jwks_url
        self._fetch: asyncio.Future[None] | None = None
        self.fetches = 0

    async def key(self, kid: str) -> PublicKey | None:
        """The key named ``kid``; a miss refetches once if the last fetch is older than
        the minimum refresh interval (else None at once). When the issuer cannot be
        reached, the keys already fetched keep verifying (an outage of the issuer stops
        no request whose key is known); only an unknown ``kid`` then fails
        (:class:`JwksUnavailable`)."""
        now = time.monotonic()
        stale = self._fetched_at is None or now - self._fetched_at > self.settings.jwks_max_age_s
        if stale or (kid not in self._keys and self._may_refresh(now)):
            try:
                await self._refresh()
            except JwksUnavailable:
                if kid not in self._keys:
                    raise
        return self._keys.get(kid)

    def _may_refresh(self, now: float) -> bool:
        last = self._fetched_at
        return last is None or now - last >= self.settings.jwks_min_refresh_s

    async def _refresh(self) -> None:
        task = self._fetch
        if task is None or task.done():
            task = self._fetch = asyncio.ensure_future(self._load())
        await asyncio.shield(task)

    async def _load(self) -> None:
        self._fetched_at = time.monotonic()  # a failed fetch also waits out the interval
        self.fetches += 1
        try:
            if self._jwks_url is None:
                discovery = await self._get_json(
                    self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration")
                uri = discovery.get("jwks_uri")
                if not isinstance(uri, str):
                    raise JwksUnavailable("discovery document has no jwks_uri")
                self._jwks_url = uri
            self._keys = _signing_keys(await self._get_json(self._jwks_url))
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("identity: cannot fetch the keys of issuer %s: %s",
                        self.settings.issuer, exc)
            raise JwksUnavailable(str(exc)) from exc

    async def _get_json(self, url: str) -> dict[str, Any]:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.settings.timeout_s)
        r = await self._client.get(url, headers={"Accept": "application/json"})
        r.raise_for_status()
        doc = r.json()
        if not isinstance(doc, dict):
            raise ValueError(f"{url}: not a JSON object")
        return doc

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def _signing_keys(jwks: dict[str, Any]) -> dict[str, PublicKey]:
    """The JWKS's keys with a ``kid`` that PyJWT can read (others are skipped: an issuer
    may publish encryption keys or algorithms this build lacks)."""
    import jwt  # PyJWT loads with the first JWKS, not at startup
    keys: dict[str, PublicKey] = {}
    for jwk in jwks.get("keys") or []:
        if not isinstance(jwk, dict) or not isinstance(jwk.get("kid"), str):
            continue
        if jwk.get("use", "sig") != "sig":
            continue
        try:
            alg = jwk.get("alg")
            keys[jwk["kid"]] = PublicKey(key=jwt.PyJWK(jwk).key,
                                         alg=alg if isinstance(alg, str) else None)
        except jwt.PyJWTError:
            continue
    return keys
