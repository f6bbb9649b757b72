"""Typed gateway settings, decoded from one YAML file with msgspec.

Secrets are never inline: a field named ``*_ref`` or ``dsn`` holds a reference
(``env:NAME`` or ``file:PATH``) resolved by :func:`gateway.config.resolve_secret`.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gateway.pricing import ModelPrice


# msgspec subclasses inherit frozen=True at runtime, but type checkers follow PEP 681
# (dataclass_transform), which does not inherit it; each subclass repeats frozen=True so
# mypy knows the settings are immutable (msgspec issue #657).
class _Base(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class ServerSettings(_Base, frozen=True):
    host: str = "127.0.0.1"
    port: int = 4000
    max_body_bytes: int = 4 * 1024 * 1024
    max_output_tokens: int = 1_000_000
    """Absolute ceiling on ``max_tokens``; larger values are refused with 400."""
    audit_path: str | None = None
    """Per-replica append-only audit file (JSON lines).

    Default: ``<data_dir>/audit-<replica>.jsonl``."""
    replica_id: str | None = None
    admin_token_ref: str | None = None
    """Reference to the admin token that may read every row of /v1/usage."""
    drain_on_disconnect_s: float = 0.0
    """After a client disconnects mid-stream: 0 aborts the upstream request at once (what
    the provider sees from a direct client); N > 0 keeps reading (and discarding) the
    upstream for up to N seconds, so the exact usage can still be settled."""
    journal_path: str | None = None
    """Per-replica settlement journal (admission, dispatch, observed outcome); never
    shared between replicas. Default: ``<data_dir>/journal-<replica>.jsonl``."""
    journal_fsync: Literal["always", "interval"] = "interval"
    """``always``: every dispatch/outcome record is fsynced before it is acted on, so a
    machine crash loses none; ``interval``: fsync every ``journal_fsync_interval_s``
    (a process crash loses nothing, a machine crash at most that interval)."""
    journal_fsync_interval_s: float = 1.0
    settle_wait_s: float = 0.5
    """How long a finished request waits for the store to take its settlement before
    leaving it to the journal's replay (the client's answer is never held longer)."""


class KeyStoreSettings(_Base, frozen=True):
    type: Literal["sqlite", "postgres"] = "sqlite"
    path: str | None = None
    """SQLite file (local profile); default ``<data_dir>/mayu.db``."""


class GovernanceStoreSettings(_Base, frozen=True):
    type: Literal["local", "postgres"] = "local"
    path: str | None = None
    """SQLite file for local windows and permits; default ``<data_dir>/mayu.db``."""
    journal: bool = False
    """A local journal; refused in shared mode (ADR-046)."""


class DatabaseSettings(_Base, frozen=True):
    dsn_ref: str = "env:INFERPLANE_DATABASE_URL"
    pool_min_size: int = 2
    pool_max_size: int = 10
    connect_timeout_s: float = 2.0
    pool_timeout_s: float = 2.0
    """How long a request waits for a pooled connection before a 503."""
    policy_refresh_s: float = 1.0
    admission_coalesce: Annotated[int, msgspec.Meta(ge=0)] = 1
    """Coalesce admissions: at most this many admission calls in flight per replica;
    requests arriving while all are busy go together as the next call. 0: off (every
    admission is its own call). Default 1: best for a hot team in tests/bench/coalesce.py
    (see docs/configuration.md)."""


class ProviderSettings(_Base, frozen=True):
    name: str
    kind: Literal["openai", "anthropic", "mock"]
    base_url: str | None = None
    api_key_ref: str | None = None
    timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    max_connections: int = 200
    latency_ms: int = 0
    """mock only: delay before the first byte and between stream chunks."""


class Deployment(_Base, frozen=True):
    provider: str
    upstream_model: str | None = None
    """The model name sent upstream (default: the gateway's model name)."""


class ModelSettings(_Base, frozen=True):
    name: str
    deployments: list[Deployment]
    """Tried in order; each fallback attempt gets its own permit."""
    price: ModelPrice = ModelPrice()
    max_output_tokens: int = 8192
    """Output ceiling used for the bound when the request does not set max_tokens."""
    input_overhead_tokens: int = 1024
    """Input tokens a provider adds to any request beyond its body (chat template, the
    tool-use system prompt: 346 tokens for Claude with tools); added to the body-length
    input bound so an ordinary request with tools never reports more than its bound."""
    max_input_tokens: int | None = None
    """The model's context window. Bounds the input of requests that make the provider add
    input the body does not carry (previous_response_id, files, image URLs, server tools);
    without it such requests are refused (400), since their cost cannot be bounded."""


class ControlPlaneSettings(_Base, frozen=True):
    url: str
    token_ref: str | None = None


class BootstrapTeam(_Base, frozen=True):
    name: str
    rpm: int | None = None
    tpm: int | None = None
    tokens_per_day: int | None = None
    usd_micros_per_day: int | None = None
    usd_micros_per_month: int | None = None


class Settings(_Base, frozen=True):
    data_dir: str = ".mayu"
    server: ServerSettings = ServerSettings()
    key_store: KeyStoreSettings = KeyStoreSettings()
    governance_store: GovernanceStoreSettings = GovernanceStoreSettings()
    database: DatabaseSettings | None = None
    providers: list[ProviderSettings] = []
    models: list[ModelSettings] = []
    policies: list[str] | None = None
    """Paths or globs of GovernancePolicy YAML files (local policy source)."""
    control_plane: ControlPlaneSettings | None = None
    bootstrap_teams: list[BootstrapTeam] = []
    demo: bool = True
    """Create a demo team and key on first run (local profile) and print the key once."""

    @property
    def shared(self) -> bool:
        return self.key_store.type == "postgres" and self.governance_store.type == "postgres"
