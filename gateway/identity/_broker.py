"""Gateway credentials: short-lived JWTs inferplaned signs for a user and a team.

The signing keys are derived from the secrets of ``identity.credentials.signing_keys_ref``
(HKDF-SHA256, so no private key is ever stored, in a file or the database): the first
secret's key signs, every listed secret's key is published in the JWKS. Rotating is
putting a new secret first and keeping the old one listed until the credentials it
signed have expired; removing a secret retires its key (its credentials are refused once
the gateways' JWKS no longer holds it). The ``kid`` is a digest of the public key.

A credential's claims: ``iss``/``aud``/``iat``/``nbf``/``exp``/``jti``, ``sub`` (the
user), ``team`` (the team name) and ``kh``: the SHA-256 the gateway resolves exactly as
a presented key's (the credential key inferplaned keeps for the user and team), so a
request on a credential is admitted as that key is: the same counters, member budget and
in-flight limits, and the usage log names the user.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

from gateway.identity._settings import CredentialSettings

_INFO = b"inferplane gateway credential signing key v1"
_P256_ORDER = int("FFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551", 16)


@dataclass(frozen=True)
class SigningKey:
    """One derived key pair and its ``kid``."""

    kid: str
    alg: str
    private: Any
    public_jwk: dict[str, Any]


def derive_key(secret: str, alg: str) -> SigningKey:
    """The key pair a signing secret stands for (the same on every inferplaned)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    seed = HKDF(algorithm=hashes.SHA256(), length=48, salt=None,
                info=_INFO + b" " + alg.encode()).derive(secret.encode())
    private: Any
    if alg == "EdDSA":
        private = ed25519.Ed25519PrivateKey.from_private_bytes(seed[:32])
        raw = private.public_key().public_bytes(serialization.Encoding.Raw,
                                                serialization.PublicFormat.Raw)
        jwk: dict[str, Any] = {"kty": "OKP", "crv": "Ed25519",
                               "x": base64.urlsafe_b64encode(raw).rstrip(b"=").decode()}
    else:
        private = ec.derive_private_key(int.from_bytes(seed) % (_P256_ORDER - 1) + 1,
                                        ec.SECP256R1())
        raw = private.public_key().public_bytes(serialization.Encoding.X962,
                                                serialization.PublicFormat.UncompressedPoint)
        jwk = {"kty": "EC", "crv": "P-256",
               "x": base64.urlsafe_b64encode(raw[1:33]).rstrip(b"=").decode(),
               "y": base64.urlsafe_b64encode(raw[33:]).rstrip(b"=").decode()}
    kid = base64.urlsafe_b64encode(hashlib.sha256(raw).digest()[:12]).decode()
    return SigningKey(kid=kid, alg=alg, private=private,
                      public_jwk={**jwk, "kid": kid, "alg": alg, "use": "sig"})


class CredentialIssuer:
    """Signs gateway credentials with the current key; publishes every listed key."""

    def __init__(self, settings: CredentialSettings, signing_secrets: list[str]) -> None:
        if not signing_secrets:
            raise ValueError("at least one signing secret")
        self.settings = settings
        self.keys = [derive_key(s, settings.algorithm) for s in signing_secrets]

    def jwks(self) -> dict[str, Any]:
        return {"keys": [k.public_jwk for k in self.keys]}

    def issue(self, *, user: str, team: str, key_hash: str,
              now: float | None = None) -> tuple[str, int]:
        """A credential for ``user`` in ``team`` resolving to ``key_hash``: (JWT, exp)."""
        s, key = self.settings, self.keys[0]
        iat = int(time.time() if now is None else now)
        exp = iat + int(s.lifetime_s)
        claims = {"iss": s.issuer, "aud": s.audience, "sub": user, "team": team,
                  "kh": key_hash, "iat": iat, "nbf": iat, "exp": exp,
                  "jti": secrets.token_urlsafe(12)}
        import jwt  # PyJWT loads with the first credential issued, not at startup
        token = jwt.encode(claims, key.private, algorithm=key.alg,
                           headers={"kid": key.kid, "typ": "JWT"})
        return token, exp
