"""The admin tokens a gateway accepts, resolved and checked once for ``serve`` and
``config check`` alike (and for the admin API that holds them).

Each token is a reference (``server.admin_tokens[i].token_ref``, or the older
``server.admin_token_ref``, a ``read`` token named ``admin``); the value behind it must be
at least ``MIN_ADMIN_TOKEN_CHARS`` characters, and no two tokens may share a name or a
value (a shared value would make the audit name the wrong holder).
"""

from __future__ import annotations

import hmac
from typing import Literal

from gateway.config._load import resolve_secret
from gateway.config._settings import ServerSettings
from gateway.errors import ConfigError

MIN_ADMIN_TOKEN_CHARS = 16
"""The shortest admin token accepted (either tier, either setting)."""

Access = Literal["read", "write"]


def resolve_admin_tokens(server: ServerSettings) -> list[tuple[str, str, Access]]:
    """Every configured admin token as ``(name, value, access)``; a :class:`ConfigError`
    naming the key for one too short, or a name or value used twice."""
    found: list[tuple[str, str, Access]] = []
    given: list[tuple[str, str, str, Access]] = []  # (config key, name, ref, access)
    if server.admin_token_ref:
        given.append(("server.admin_token_ref", "admin", server.admin_token_ref, "read"))
    given += [(f"server.admin_tokens[{i}].token_ref", t.name, t.token_ref, t.access)
              for i, t in enumerate(server.admin_tokens)]
    for key, name, ref, access in given:
        value = resolve_secret(ref, key=key)
        if len(value) < MIN_ADMIN_TOKEN_CHARS:
            raise ConfigError(f"{key}: the token must be at least {MIN_ADMIN_TOKEN_CHARS} "
                              f"characters (it has {len(value)})")
        for other, other_value, _ in found:
            if other == name:
                raise ConfigError(f"{key.removesuffix('.token_ref')}.name: {name!r} is "
                                  "used twice")
            if hmac.compare_digest(other_value.encode(), value.encode()):
                raise ConfigError(f"{key}: the same token as {other!r}")
        found.append((name, value, access))
    return found
