"""Identity settings: the OIDC issuers a plane trusts and the gateway credentials it accepts.

Shared by ``mayu`` (``identity:`` in its config, ``gateway.config.Settings``) and
``inferplaned`` (the same section in its own): an :class:`IssuerSettings` says how to
verify one issuer's tokens and how to read a person and their teams from the claims
(:mod:`gateway.identity` does it).
The algorithm allow-list admits asymmetric signatures only: ``none`` and HMAC are refused
at decoding, so a public key can never be used as an HMAC secret.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gateway.roles import RoleSettings

Algorithm = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                    "ES256", "ES384", "ES512", "EdDSA"]
"""The asymmetric JWS algorithms an issuer may be trusted with (never ``none`` or HS*)."""

# The ranges of gateway/config/_ranges.py, restated: gateway.config imports this module.
Seconds = Annotated[float, msgspec.Meta(gt=0, le=86_400.0)]
SecondsOrZero = Annotated[float, msgspec.Meta(ge=0, le=86_400.0)]
ClaimName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.:/-]{1,128}$")]
Url = Annotated[str, msgspec.Meta(pattern=r"^https?://[^\s]{1,2000}$")]


class _Base(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class IssuerSettings(_Base, frozen=True):
    """One trusted token issuer (an OIDC provider, or inferplaned for gateway credentials)."""

    issuer: Url
    """The exact ``iss`` of its tokens (discovery: ``{iss}/.well-known/openid-configuration``)."""
    audience: Annotated[tuple[Annotated[str, msgspec.Meta(min_length=1, max_length=512)], ...],
                        msgspec.Meta(min_length=1, max_length=32)]
    """Accepted ``aud`` values (a token must name one of them)."""
    jwks_url: Url | None = None
    """The JWKS; unset: the ``jwks_uri`` of the issuer's discovery document."""
    user_claim: ClaimName = "email"
    """The claim naming the user (``email``, ``preferred_username`` or ``sub``)."""
    groups_claim: ClaimName = "groups"
    """The claim listing the user's groups (a list of strings; absent: no groups)."""
    team_aliases: dict[str, str] = {}
    """Group → team name; a group without an alias is the team of the same name."""
    algorithms: Annotated[tuple[Algorithm, ...], msgspec.Meta(min_length=1)] = (
        "RS256", "ES256", "PS256")
    leeway_s: Annotated[float, msgspec.Meta(ge=0, le=300)] = 30.0
    """Clock skew allowed on ``exp``, ``nbf`` and ``iat``."""
    jwks_min_refresh_s: SecondsOrZero = 30.0
    """An unknown ``kid`` refetches the JWKS at most once per this many seconds."""
    jwks_max_age_s: Seconds = 3600.0
    """The JWKS is refetched when older than this even if every ``kid`` is known."""
    timeout_s: Seconds = 5.0
    """Discovery and JWKS fetch timeout."""
    roles: RoleSettings | None = None  # console and admin API roles: gateway/roles.py


class CredentialSettings(_Base, frozen=True):
    """inferplaned as the issuer of gateway credentials (RFC 8693 token exchange)."""

    issuer: Url
    """The ``iss`` of its credentials: inferplaned's external URL."""
    signing_keys_ref: Annotated[list[str], msgspec.Meta(min_length=1, max_length=8)]
    """Secret references (``env:``/``file:``): the first signs, every one is published in
    the JWKS (a rotation puts a new secret first and keeps the old one until its
    credentials expired; removing it retires its key)."""
    audience: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] = "mayu"
    lifetime_s: Annotated[float, msgspec.Meta(ge=60, le=86_400)] = 3600.0
    """How long a credential is valid."""
    algorithm: Literal["EdDSA", "ES256"] = "EdDSA"


class IdentitySettings(_Base, frozen=True):
    """``identity:`` — who may sign in (issuers) and, for inferplaned, what it brokers."""

    issuers: Annotated[list[IssuerSettings], msgspec.Meta(max_length=32)] = []
    credentials: CredentialSettings | None = None
    """inferplaned: the credentials it issues. mayu: unused (see ``broker``)."""
    broker: IssuerSettings | None = None
    """mayu: inferplaned as the issuer of the gateway credentials this gateway accepts
    (``jwks_url`` ``{inferplaned}/v1alpha1/jwks.json``, ``algorithms: [EdDSA]``,
    ``user_claim: sub``)."""
