"""Verifying a token of a trusted issuer into an :class:`Identity`.

The order matters for what a forged token can make the verifier do: the header's
``alg`` is checked against the issuer's allow-list (asymmetric algorithms only, so never
``none`` and never an HMAC keyed with a public key) and against the key's own ``alg``
before any signature check; the key comes only from the issuer's JWKS, by ``kid``; then
PyJWT checks the signature and ``iss``/``aud``/``exp``/``nbf``/``iat`` (``exp`` and
``iat`` required) with the issuer's leeway. Every refusal is :class:`InvalidToken`, a
401 whose message says which check failed and never echoes the token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import Unauthenticated
from gateway.identity._jwks import JwksCache, JwksUnavailable
from gateway.identity._settings import IssuerSettings


class InvalidToken(Unauthenticated):
    """Invalid or expired credential."""


@dataclass(frozen=True)
class Identity:
    """Who a verified token names: its issuer and subject (the stable pair), the user
    (the configured claim) and the teams its groups map to."""

    issuer: str
    subject: str
    user: str
    teams: tuple[str, ...]
    claims: Mapping[str, Any] = field(repr=False, compare=False)
    expires_at: int = 0
    """The token's ``exp`` (Unix seconds)."""


def unverified_issuer(token: str) -> str | None:
    """The ``iss`` a token claims, read without verifying it (to pick the issuer whose
    keys then verify it), or None when the token is not a JWT."""
    import jwt  # PyJWT loads with the first token, not at startup
    try:
        iss = jwt.decode(token, options={"verify_signature": False}).get("iss")
    except jwt.PyJWTError:
        return None
    return iss if isinstance(iss, str) else None


class Verifier:
    """One trusted issuer's tokens, verified against its JWKS."""

    def __init__(self, settings: IssuerSettings, *, jwks: JwksCache | None = None) -> None:
        self.settings = settings
        self.jwks = jwks or JwksCache(settings)

    async def verify(self, token: str) -> Identity:
        """The token's :class:`Identity`; :class:`InvalidToken` naming the failed check."""
        claims = await self.claims(token)
        return self.identity(claims)

    async def claims(self, token: str) -> dict[str, Any]:
        """The verified claims of ``token``."""
        import jwt
        s = self.settings
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise InvalidToken("credential is not a well-formed JWT") from exc
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in s.algorithms:
            raise InvalidToken(f"credential algorithm {str(alg)[:16]!r} is not accepted "
                               f"(accepted: {', '.join(s.algorithms)})")
        if not isinstance(kid, str):
            raise InvalidToken("credential names no signing key (kid)")
        try:
            key = await self.jwks.key(kid)
        except JwksUnavailable as exc:
            raise InvalidToken("the issuer's signing keys are unavailable") from exc
        if key is None:
            raise InvalidToken("credential signing key is unknown or retired")
        if key.alg is not None and key.alg != alg:
            raise InvalidToken(f"credential algorithm {alg} does not match its key")
        try:
            verified: dict[str, Any] = jwt.decode(
                token, key.key, algorithms=[alg], audience=s.audience, issuer=s.issuer,
                leeway=s.leeway_s, options={"require": ["exp", "iat", "iss", "aud", "sub"]})
        except jwt.ExpiredSignatureError as exc:
            raise InvalidToken("credential expired") from exc
        except jwt.ImmatureSignatureError as exc:
            raise InvalidToken("credential not yet valid (nbf or iat in the future)") from exc
        except jwt.InvalidAudienceError as exc:
            raise InvalidToken("credential audience is not accepted") from exc
        except jwt.InvalidIssuerError as exc:
            raise InvalidToken("credential issuer is not accepted") from exc
        except jwt.MissingRequiredClaimError as exc:
            raise InvalidToken(f"credential lacks the {exc.claim!r} claim") from exc
        except jwt.InvalidSignatureError as exc:
            raise InvalidToken("credential signature is invalid") from exc
        except (jwt.PyJWTError, ValueError) as exc:
            raise InvalidToken("credential is invalid") from exc
        return verified

    def identity(self, claims: dict[str, Any]) -> Identity:
        """The person and teams named by verified ``claims``."""
        s = self.settings
        user = claims.get(s.user_claim)
        if not isinstance(user, str) or not user or len(user) > 256:
            raise InvalidToken(f"credential has no usable {s.user_claim!r} claim")
        groups = claims.get(s.groups_claim) or []
        if isinstance(groups, str):
            groups = [groups]
        if not isinstance(groups, list):
            raise InvalidToken(f"credential's {s.groups_claim!r} claim is not a list")
        teams = tuple(dict.fromkeys(
            s.team_aliases.get(g, g) for g in groups if isinstance(g, str) and g))
        return Identity(issuer=str(claims["iss"]), subject=str(claims["sub"]), user=user,
                        teams=teams, claims=claims, expires_at=int(claims["exp"]))


class Verifiers:
    """Several trusted issuers: a token is verified by the one its ``iss`` names."""

    def __init__(self, issuers: list[IssuerSettings]) -> None:
        self.by_issuer = {s.issuer: Verifier(s) for s in issuers}

    async def verify(self, token: str) -> Identity:
        iss = unverified_issuer(token)
        verifier = self.by_issuer.get(iss) if iss is not None else None
        if verifier is None:
            raise InvalidToken("credential issuer is not accepted")
        return await verifier.verify(token)

    async def aclose(self) -> None:
        for verifier in self.by_issuer.values():
            await verifier.jwks.aclose()
