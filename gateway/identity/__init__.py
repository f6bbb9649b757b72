"""Identity: OIDC tokens verified into a person and their teams, and the short-lived
gateway credentials inferplaned brokers for them (ADR-031, docs/identity.md).

:class:`Verifier` checks one issuer's tokens against its JWKS (:class:`JwksCache`:
discovery, cache, refresh on an unknown ``kid`` at a bounded rate) into an
:class:`Identity`; :class:`Verifiers` picks the issuer by ``iss``.
:class:`CredentialIssuer` signs gateway credentials with keys derived from configured
secrets and publishes their JWKS; :class:`GatewayCredentials` is a gateway's side of
them (verified locally, cached until they expire).
"""

from gateway.identity._accept import GatewayCredentials, looks_like_jwt
from gateway.identity._agent import SignInFailed, default_cache, login
from gateway.identity._agent import credential as mint_credential
from gateway.identity._broker import CredentialIssuer, SigningKey, derive_key
from gateway.identity._jwks import JwksCache, JwksUnavailable, PublicKey
from gateway.identity._people import (
    Refused,
    Revoked,
    brokered_key_hash,
    reinstate_person,
    revoke_person,
)
from gateway.identity._settings import CredentialSettings, IdentitySettings, IssuerSettings
from gateway.identity._verify import (
    Identity,
    InvalidToken,
    Verifier,
    Verifiers,
    unverified_issuer,
)

__all__ = [
    "CredentialIssuer",
    "GatewayCredentials",
    "CredentialSettings",
    "IdentitySettings",
    "IssuerSettings",
    "Identity",
    "InvalidToken",
    "JwksCache",
    "JwksUnavailable",
    "PublicKey",
    "Refused",
    "Revoked",
    "SignInFailed",
    "SigningKey",
    "Verifier",
    "Verifiers",
    "brokered_key_hash",
    "default_cache",
    "derive_key",
    "login",
    "mint_credential",
    "reinstate_person",
    "revoke_person",
    "looks_like_jwt",
    "unverified_issuer",
]
