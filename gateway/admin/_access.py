"""Who may use the admin API: named tokens, by reference, in two tiers.

``server.admin_tokens`` lists them (``name``, ``token_ref``, ``access``: ``read`` or
``write``); the older ``server.admin_token_ref`` counts as a ``read`` token named
``admin``. Every reference is resolved at startup (a bad one fails naming its key). A
presented token is compared with every configured one in constant time, all of them
every time, so neither the answer nor its timing tells which token came close.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Literal

from gateway.config import ServerSettings, resolve_secret
from gateway.errors import AccessDenied, ConfigError, Unauthenticated
from gateway.ingress import ActingFor

Access = Literal["read", "write"]


@dataclass(frozen=True)
class AdminCaller:
    """The holder of a presented admin token: its configured name and access."""

    name: str
    access: Access


class AdminAccess:
    """The configured admin tokens, resolved."""

    def __init__(self, tokens: list[tuple[str, str, Access]]) -> None:
        self._tokens = [(name, secret.encode(), access) for name, secret, access in tokens]

    @classmethod
    def from_settings(cls, server: ServerSettings) -> AdminAccess:
        tokens: list[tuple[str, str, Access]] = []
        if server.admin_token_ref:
            tokens.append(("admin", resolve_secret(server.admin_token_ref,
                                                   key="server.admin_token_ref"), "read"))
        for i, t in enumerate(server.admin_tokens):
            key = f"server.admin_tokens[{i}]"
            secret = resolve_secret(t.token_ref, key=f"{key}.token_ref")
            if len(secret) < 16:
                raise ConfigError(f"{key}.token_ref: the token must be at least 16 "
                                  "characters")
            for name, other, _ in tokens:
                if name == t.name:
                    raise ConfigError(f"{key}.name: {t.name!r} is used twice")
                if hmac.compare_digest(other.encode(), secret.encode()):
                    raise ConfigError(f"{key}.token_ref: the same token as {name!r}")
            tokens.append((t.name, secret, t.access))
        return cls(tokens)

    @property
    def configured(self) -> bool:
        return bool(self._tokens)

    def caller(self, presented: str | ActingFor | None) -> AdminCaller | None:
        """The token's holder, or None when ``presented`` is no configured token (an
        in-process :class:`ActingFor` names one by its SHA-256)."""
        if not presented:
            return None
        digest = isinstance(presented, ActingFor)
        given = (presented.credential_sha256 if isinstance(presented, ActingFor)
                 else presented.encode())
        found: AdminCaller | None = None
        for name, secret, access in self._tokens:  # no early exit: constant time
            if hmac.compare_digest(given, hashlib.sha256(secret).digest() if digest
                                   else secret):
                found = AdminCaller(name, access)
        return found

    def require(self, presented: str | ActingFor | None, access: Access) -> AdminCaller:
        """The caller, if its token allows ``access``: else 401 (no such token) or 403
        (a read token asked to write)."""
        caller = self.caller(presented)
        if caller is None:
            raise Unauthenticated("the admin API needs an admin token "
                                  "(Authorization: Bearer ...; server.admin_tokens)")
        if access == "write" and caller.access != "write":
            raise AccessDenied(f"admin token {caller.name!r} is read-only")
        return caller
