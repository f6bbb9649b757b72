"""inferplaned configuration: one YAML file, decoded with msgspec, errors name the key.

Example::

    database:
      dsn_ref: env:INFERPLANE_DATABASE_URL
    listen:
      host: 0.0.0.0
      port: 8470
    auth:
      writer_tokens_ref:            # token name -> reference; the name is the change author
        ci: env:INFERPLANED_CI_TOKEN
      reader_tokens_ref:
        dashboards: file:/run/secrets/inferplaned-reader
      dataplane_tokens_ref:         # lease-profile gateways: POST /v1alpha1/sync only
        nodes: file:/run/secrets/inferplaned-dataplane

Tokens are never inline: each value is an ``env:NAME`` or ``file:PATH`` reference resolved
by :func:`gateway.config.resolve_secret`. The database section is the gateway's own
:class:`gateway.config.DatabaseSettings`, so both programs read a DSN the same way.
"""

from __future__ import annotations

import ipaddress
import os
from typing import NamedTuple

import msgspec

from gateway.config import (
    Bytes,
    DatabaseSettings,
    Port,
    SecondsOrZero,
    decode_yaml_file,
    resolve_secret,
)
from gateway.errors import ConfigError


# msgspec subclasses inherit frozen=True at runtime, but type checkers follow PEP 681
# (dataclass_transform), which does not inherit it; each subclass repeats frozen=True so
# mypy knows the settings are immutable (msgspec issue #657).
class _Base(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class ListenSettings(_Base, frozen=True):
    host: str = "127.0.0.1"
    port: Port = 8470


class AuthSettings(_Base, frozen=True):
    writer_tokens_ref: dict[str, str] = {}
    """Token name → secret reference; writers may publish and read."""
    reader_tokens_ref: dict[str, str] = {}
    """Token name → secret reference; readers may only read."""
    dataplane_tokens_ref: dict[str, str] = {}
    """Token name → secret reference; data planes may only sync (``POST /v1alpha1/sync``),
    never read or publish policies. Several planes may share one token: each names
    itself in the heartbeat, and the token's name is recorded beside it."""


class ControlPlaneConfig(_Base, frozen=True):
    database: DatabaseSettings = DatabaseSettings()
    listen: ListenSettings = ListenSettings()
    auth: AuthSettings = AuthSettings()
    max_body_bytes: Bytes = 1024 * 1024
    """Largest accepted policy document (bytes)."""
    max_sync_bytes: Bytes = 4 * 1024 * 1024
    """Largest accepted heartbeat (bytes): one report line per lease-managed account."""
    shutdown_grace_s: SecondsOrZero = 30.0
    """On SIGTERM: how long in-flight requests may finish (new connections are refused
    and ``/readyz`` fails at once)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_config(path: str | os.PathLike[str] | None) -> ControlPlaneConfig:
    """Read and check the config file (``None``: defaults, loopback, unauthenticated)."""
    if path is None:
        return ControlPlaneConfig()
    # Every number has a msgspec range (gateway/config/_ranges.py): a bad one fails
    # decoding with its key path.
    config = decode_yaml_file(path, ControlPlaneConfig)
    db = config.database
    if db.pool_min_size > db.pool_max_size:
        raise ConfigError(f"{path}: database.pool_min_size: {db.pool_min_size} is above "
                          f"database.pool_max_size ({db.pool_max_size})")
    return config


class Tokens(NamedTuple):
    """Every configured token by tier, as name → token."""

    writers: dict[str, str]
    readers: dict[str, str]
    dataplanes: dict[str, str]

    @property
    def any(self) -> bool:
        return bool(self.writers or self.readers or self.dataplanes)


def resolve_tokens(auth: AuthSettings) -> Tokens:
    """Every tier's tokens as name → token, every reference resolved and checked."""
    resolved: list[dict[str, str]] = []
    seen: dict[str, str] = {}
    for section, refs in (("writer_tokens_ref", auth.writer_tokens_ref),
                          ("reader_tokens_ref", auth.reader_tokens_ref),
                          ("dataplane_tokens_ref", auth.dataplane_tokens_ref)):
        out: dict[str, str] = {}
        for name, ref in refs.items():
            key = f"auth.{section}.{name}"
            if not name.strip():
                raise ConfigError(f"auth.{section}: token names must not be empty")
            token = resolve_secret(ref, key=key)
            if len(token) < 16:
                raise ConfigError(f"{key}: token must be at least 16 characters")
            if token in seen:
                raise ConfigError(f"{key}: same token as {seen[token]} (each token must "
                                  "identify one writer, reader or data plane tier)")
            seen[token] = key
            out[name] = token
        resolved.append(out)
    sections = ("writer_tokens_ref", "reader_tokens_ref", "dataplane_tokens_ref")
    for later in (1, 2):
        for earlier in range(later):
            dup = sorted(set(resolved[earlier]) & set(resolved[later]))
            if dup:
                kind = sections[earlier].split("_")[0]
                raise ConfigError(f"auth.{sections[later]}.{dup[0]}: name also used by a "
                                  f"{kind} token (names attribute changes, so they must be "
                                  "unique)")
    return Tokens(*resolved)
