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
        node-a:                     # one token per node, naming the plane ids it may use
          token_ref: file:/run/secrets/inferplaned-node-a
          planes: [node-a]          # exact ids, or a prefix ending in '*' (pool-b-*)
          teams: [ml, platform]     # the teams its planes may report for (unset: any)
    lease:
      frame_change_interval_s: 300  # a plane's counters replaced at most this often
      max_accounts_per_plane: 5000  # ledger rows one plane may hold in the open windows
    credentials:                    # brokered to lease planes (POST /v1alpha1/credentials)
      bedrock:                      # the name a plane's provider asks for
        aws:                        # the role assumed per team (gateway's {kind: aws})
          region: us-east-1
          role_arn: arn:aws:iam::123456789012:role/inferplane-bedrock
          duration_s: 900
        teams: [ml, platform]       # who may have it (unset: any team a token serves)

Tokens are never inline: each value is an ``env:NAME`` or ``file:PATH`` reference resolved
by :func:`gateway.config.resolve_secret`. A data-plane token given as a bare reference
may report for any plane id (inferplaned warns at startup): only the first-come binding
of an id to its token protects the others. The database section is the gateway's own
:class:`gateway.config.DatabaseSettings`, so both programs read a DSN the same way.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from typing import Annotated, NamedTuple

import msgspec

from gateway.config import (
    AwsCredentials,
    Bytes,
    DatabaseSettings,
    Port,
    Seconds,
    SecondsOrZero,
    SettingsBase,
    decode_yaml_file,
    resolve_secret,
)
from gateway.errors import ConfigError
from gateway.identity import IdentitySettings


# Each subclass repeats frozen=True so that mypy knows the settings are immutable
# (gateway/config/_settings.py says why).
class ListenSettings(SettingsBase, frozen=True):
    host: str = "127.0.0.1"
    port: Port = 8470


PlaneId = Annotated[str, msgspec.Meta(min_length=1, max_length=253,
                                      pattern=r"^[^\s*]+\*?$")]
"""A plane id a data-plane token may report for, or a prefix of ids ending in ``*``."""
TeamName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
"""A team a data-plane token's planes may report for."""


class DataPlaneToken(SettingsBase, frozen=True):
    """A data-plane token bound to the plane ids it may report for."""

    token_ref: str
    planes: Annotated[list[PlaneId], msgspec.Meta(min_length=1, max_length=10_000)]
    """Exact plane ids (``node-a``) or id prefixes (``pool-b-*``)."""
    teams: Annotated[list[TeamName], msgspec.Meta(min_length=1,
                                                   max_length=100_000)] | None = None
    """The teams whose consumption this token's planes may report (their gateways' key
    store): a reported account of any other team is refused, counted
    (``inferplaned_lease_account_refusals{reason="not_granted"}``) and logged as an
    alarm, and never reaches the ledger. Unset: any team the heartbeat lists."""


class AuthSettings(SettingsBase, frozen=True):
    writer_tokens_ref: dict[str, str] = {}
    """Token name → secret reference; writers may publish and read."""
    reader_tokens_ref: dict[str, str] = {}
    """Token name → secret reference; readers may only read."""
    dataplane_tokens_ref: dict[str, str | DataPlaneToken] = {}
    """Token name → ``{token_ref, planes}`` (or a bare secret reference: any plane id);
    data planes may only sync (``POST /v1alpha1/sync``, whose answer carries the published
    set and their own accounts' leases), never use the policy API or publish.
    A plane id belongs to the token that first synced it: another configured token's
    heartbeat for it is refused (409), and a token's heartbeat for an id outside its
    ``planes`` too (403)."""


class LeaseSettings(SettingsBase, frozen=True):
    frame_change_interval_s: Seconds = 300.0
    """A plane may come back with fresh counters (a new frame, whose adoption turns its
    old allowance into liability) at most once per this many seconds: after its first
    adoption, a new frame is refused until this long after its current frame's first
    heartbeat."""
    max_accounts_per_plane: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 5_000
    """Ledger rows one plane may hold in the windows the control plane accepts (the
    current ones and, around midnight, the adjacent ones)."""


class BrokeredCredential(SettingsBase, frozen=True):
    """Cloud credentials inferplaned hands to lease planes (:mod:`controlplane.credentials`):
    STS sessions of ``aws.role_arn``, one per request, named and tagged with the team
    and the plane, for a team the asking plane's token serves."""

    aws: AwsCredentials
    """The role to assume and inferplaned's own credentials to assume it with (the
    gateway's ``{kind: aws}`` shape; ``role_arn`` required, ``broker`` not allowed)."""
    teams: Annotated[list[TeamName], msgspec.Meta(min_length=1)] | None = None
    """The teams that may have it (unset: any team a plane's token serves)."""


class ControlPlaneConfig(SettingsBase, frozen=True):
    database: DatabaseSettings = DatabaseSettings()
    listen: ListenSettings = ListenSettings()
    auth: AuthSettings = AuthSettings()
    lease: LeaseSettings = LeaseSettings()
    max_body_bytes: Bytes = 1024 * 1024
    """Largest accepted policy document (bytes)."""
    max_sync_bytes: Bytes = 4 * 1024 * 1024
    """Largest accepted heartbeat (bytes): one report line per lease-managed account."""
    shutdown_grace_s: SecondsOrZero = 30.0
    """On SIGTERM: how long in-flight requests may finish (new connections are refused
    and ``/readyz`` fails at once)."""
    identity: IdentitySettings | None = None
    """The OIDC issuers whose tokens it exchanges and the gateway credentials it signs
    (``POST /v1alpha1/token``, docs/identity.md); unset: no token exchange."""
    credentials: dict[str, BrokeredCredential] = {}
    """Name → a cloud credential brokered to lease planes (docs/bedrock.md, "Lease
    profile"); empty: ``POST /v1alpha1/credentials`` answers 404 for every name."""


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
    """Every configured token by tier, as name → token, and the plane ids each data-plane
    token may report for (name → ids and ``prefix*`` entries; absent: any id)."""

    writers: dict[str, str]
    readers: dict[str, str]
    dataplanes: dict[str, str]
    planes: dict[str, tuple[str, ...]] = {}
    teams: dict[str, tuple[str, ...]] = {}
    """Data-plane token name → the teams its planes may report for (absent: any)."""

    @property
    def any(self) -> bool:
        return bool(self.writers or self.readers or self.dataplanes)

    @property
    def unscoped(self) -> list[str]:
        """Data-plane token names that may report for any plane id."""
        return sorted(n for n in self.dataplanes if n not in self.planes)


def _ref(value: str | DataPlaneToken) -> str:
    return value if isinstance(value, str) else value.token_ref


def resolve_tokens(auth: AuthSettings) -> Tokens:
    """Every tier's tokens as name → token, every reference resolved and checked."""
    resolved: list[dict[str, str]] = []
    seen: dict[str, str] = {}
    dataplanes = auth.dataplane_tokens_ref
    tiers: tuple[tuple[str, Mapping[str, str | DataPlaneToken]], ...] = (
        ("writer_tokens_ref", auth.writer_tokens_ref),
        ("reader_tokens_ref", auth.reader_tokens_ref),
        ("dataplane_tokens_ref", dataplanes))
    for section, refs in tiers:
        out: dict[str, str] = {}
        for name, value in refs.items():
            key = f"auth.{section}.{name}"
            if not name.strip():
                raise ConfigError(f"auth.{section}: token names must not be empty")
            ref = _ref(value)
            if not isinstance(value, str):
                key += ".token_ref"
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
    planes = {name: tuple(v.planes) for name, v in dataplanes.items()
              if isinstance(v, DataPlaneToken)}
    owner: dict[str, str] = {}
    for name, ids in planes.items():
        for plane in ids:
            if plane in owner and owner[plane] != name:
                raise ConfigError(f"auth.dataplane_tokens_ref.{name}.planes: {plane!r} is "
                                  f"also bound to token {owner[plane]!r} (a plane id "
                                  "belongs to one token)")
            owner[plane] = name
    writers, readers, dataplane_tokens = resolved
    teams = {name: tuple(v.teams) for name, v in dataplanes.items()
             if isinstance(v, DataPlaneToken) and v.teams is not None}
    return Tokens(writers, readers, dataplane_tokens, planes, teams)


def may_report(patterns: tuple[str, ...] | None, plane_id: str) -> bool:
    """Whether a token bound to ``patterns`` (None: unbound) may report for ``plane_id``."""
    if patterns is None:
        return True
    return any(plane_id.startswith(p[:-1]) if p.endswith("*") else plane_id == p
               for p in patterns)
