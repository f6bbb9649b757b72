"""A gateway's side of brokered credentials: verified locally, cached until they expire.

``mayu`` trusts inferplaned as the issuer of ``identity.broker`` and verifies a presented
credential against inferplaned's JWKS (fetched at the first credential and on an unknown
``kid``, never per request). A verified credential names the SHA-256 of the key it
stands for (``kh``): the request path then resolves that hash exactly as a presented
key's, so the credential is admitted as that key (its counters, member budget, in-flight
limit and user) and a revoked user's key refuses it on every replica at once. The
verification is cached by the credential's SHA-256 until its ``exp`` (bounded), so a
repeated credential costs one hash and one dict lookup.

On a lease-profile plane the brokered keys come with inferplaned's heartbeat answers: a
credential issued since the last one names a key the plane does not hold yet, so its
first verification waits for one early heartbeat (``on_new``,
:meth:`gateway.lease.LeaseClient.await_brokered_key`) instead of answering 401.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable

from gateway.identity._settings import IssuerSettings
from gateway.identity._verify import InvalidToken, Verifier

_MAX_CACHED = 50_000


def looks_like_jwt(presented: str) -> bool:
    """A JWS compact serialization (``eyJ…``, three parts), not a virtual key."""
    return presented.startswith("eyJ") and presented.count(".") == 2


class GatewayCredentials:
    """inferplaned's credentials as one gateway accepts them."""

    def __init__(self, broker: IssuerSettings, *,
                 on_new: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.verifier = Verifier(broker)
        self.on_new = on_new
        """Awaited with the key hash of each newly verified credential (the lease
        profile fetches a key it does not hold yet)."""
        self._verified: dict[bytes, tuple[float, str, str]] = {}
        """Credential SHA-256 → (its exp, the key hash it stands for, its kid)."""

    async def key_hash(self, credential: str) -> str:
        """The key hash a valid credential stands for; :class:`InvalidToken` otherwise."""
        digest = hashlib.sha256(credential.encode()).digest()
        cached = self._verified.get(digest)
        now = time.time()
        if cached is not None and now < cached[0]:
            if await self.verifier.jwks.key(cached[2]) is not None:
                return cached[1]
            self._verified.pop(digest, None)
            raise InvalidToken("credential signing key is unknown or retired")
        claims = await self.verifier.claims(credential)
        kh = claims.get("kh")
        if not isinstance(kh, str) or len(kh) != 64:
            raise InvalidToken("credential names no gateway key")
        if len(self._verified) >= _MAX_CACHED:  # bounded: drop the oldest
            self._verified.pop(next(iter(self._verified)))
        import jwt  # loaded by the verification above
        kid = str(jwt.get_unverified_header(credential)["kid"])
        self._verified[digest] = (float(claims["exp"]), kh, kid)
        if self.on_new is not None:
            await self.on_new(kh)
        return kh

    async def aclose(self) -> None:
        await self.verifier.jwks.aclose()
