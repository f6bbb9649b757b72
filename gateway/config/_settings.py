"""Typed gateway settings, decoded from one YAML file with msgspec.

Secrets are never inline: a field named ``*_ref`` or ``dsn`` holds a reference
(``env:NAME`` or ``file:PATH``) resolved by :func:`gateway.config.resolve_secret`.
Every numeric field has a range (``gateway/config/_ranges.py``), checked at decoding, so
an out-of-range value fails naming its key path.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gateway.config._credentials import Credentials
from gateway.config._ranges import (
    BatchSize,
    Bytes,
    CacheEntries,
    Coalesce,
    Connections,
    FileCount,
    Limit,
    Millis,
    Percent,
    PoolSize,
    Port,
    Rate,
    Retries,
    Seconds,
    SecondsOrZero,
    Tokens,
    TokensOrZero,
    Workers,
)
from gateway.config._routing import (
    InFlight,
    RoutingSettings,
    Weight,
    check_deployment_price,
)
from gateway.guardrails import GuardrailSettings
from gateway.identity import IdentitySettings
from gateway.pricing import ModelPrice
from gateway.telemetry import TelemetrySettings


# msgspec subclasses inherit frozen=True at runtime, but type checkers follow PEP 681
# (dataclass_transform), which does not inherit it; each subclass repeats frozen=True so
# mypy knows the settings are immutable (msgspec issue #657).
class SettingsBase(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A block of settings: immutable, keyword-only, and an unknown key is an error
    naming its path (the gateway's and inferplaned's config files alike)."""


class AlertSettings(SettingsBase, frozen=True):
    """Budget alerts (ADR-050, docs/deploy.md "Budget alerts"): every money budget with a
    limit emits one event per window when its committed + liability first reaches 80, 90
    and 100 % of the limit, deduplicated across replicas by the governance store. Each
    event is counted (``mayu_budget_alerts_total``), written to the audit file and, with
    ``webhook_url``, POSTed there signed with the ``secret_ref`` secret."""

    enabled: bool = True
    """false: no threshold is checked (no metric, audit line or webhook)."""
    webhook_url: str | None = None
    """http(s) URL the JSON event is POSTed to (none: metric and audit line only)."""
    secret_ref: str | None = None
    """Reference to the HMAC-SHA256 key of the ``x-inferplane-signature`` header;
    required with ``webhook_url``."""
    timeout_s: Seconds = 5.0
    """One delivery attempt's timeout."""
    retries: Retries = 5
    """Attempts after the first one fails (connection error, timeout, 408, 429, 5xx)."""
    retry_backoff_s: Seconds = 1.0
    """Wait before the first retry; doubled after each, at most 60 s."""


class AdminToken(SettingsBase, frozen=True):
    """One admin API token (``/admin/v1``), by reference, with its name and access."""

    name: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")]
    """Who holds it (``terraform``, ``portal``): every write's audit line names it."""
    token_ref: str
    """``env:NAME`` or ``file:PATH`` (resolved at startup; never an inline value)."""
    access: Literal["read", "write"] = "read"
    """``read``: every GET of the admin API and every /v1/usage row; ``write``: also
    creates, edits, rotates and revokes."""


class ConsoleSettings(SettingsBase, frozen=True):
    """The console's sign-in (docs/console.md, "Sign-in and sessions"): how long a
    session lasts, when its cookie is ``Secure``, how many failed sign-ins an address
    may make."""

    session_idle_s: Seconds = 1800.0
    """A session unused this long is signed out (every console request uses it)."""
    session_max_s: Seconds = 43_200.0
    """A session ends this long after its sign-in, however busy it is."""
    secure_cookie: Literal["auto", "always"] = "auto"
    """``auto``: the console's cookies are ``Secure`` when the visitor's request was
    https (to the gateway, or to a proxy of ``server.trusted_proxies`` that says so in
    ``X-Forwarded-Proto``); ``always``: ``Secure`` whatever the scheme (a browser then
    keeps them only over https, or from ``localhost``)."""
    sign_in_failures: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 10
    """Failed sign-ins one client address may make within ``sign_in_window_s`` (per
    gateway process); past it every sign-in from that address is a 429 with
    ``Retry-After`` until its oldest failure leaves the window."""
    sign_in_window_s: Seconds = 300.0


class ServerSettings(SettingsBase, frozen=True):
    host: str = "127.0.0.1"
    port: Port = 4000
    max_body_bytes: Bytes = 4 * 1024 * 1024
    max_output_tokens: Tokens = 1_000_000
    """Absolute ceiling on ``max_tokens``; larger values are refused with 400."""
    audit_path: str | None = None
    """Per-replica append-only audit file (JSON lines).

    Default: ``<data_dir>/audit-<replica>.jsonl``."""
    audit_fsync: Literal["always", "interval"] = "interval"
    """``always``: every audit line is fsynced before the gateway goes on (a machine
    crash loses none); ``interval``: fsync every ``audit_fsync_interval_s``. Either way a
    line is one ``write`` with ``O_APPEND``: a process crash loses nothing written."""
    audit_fsync_interval_s: Seconds = 1.0
    audit_max_bytes: Bytes = 64 * 1024 * 1024
    """Rotate the audit file when it reaches this size: ``<file>`` becomes ``<file>.1``
    (older ones shift up) and a new ``<file>`` is opened."""
    audit_keep: FileCount = 5
    """Rotated audit files kept besides the current one (the oldest is removed)."""
    replica_id: str | None = None
    admin_token_ref: str | None = None
    """Reference to the admin token that may read every row of /v1/usage (and, as a
    ``read`` admin token named ``admin``, the admin API)."""
    admin_tokens: list[AdminToken] = []
    """The admin API's tokens (docs/admin-api.md)."""
    rotation_secret_ref: str | None = None
    """Reference to the secret (at least 32 characters, the same on every replica) a key
    rotation's new secret is derived with when it carries an Idempotency-Key, so a retry
    answers the same secret while a copy of the database cannot recompute it. Without
    it: the local profile draws its own into ``<db>.rotation-key``; the shared profile
    refuses Idempotency-Key rotations (docs/admin-api.md, "Rotating a key")."""
    rotation_secret_previous_refs: list[str] = []
    """Earlier rotation secrets, still used to answer a retry of a rotation made with one
    of them (after the operator changes ``rotation_secret_ref``); never for new ones."""
    drain_on_disconnect_s: SecondsOrZero = 0.0
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
    journal_fsync_interval_s: Seconds = 1.0
    settle_wait_s: SecondsOrZero = 0.0
    """How long a finished request's answer waits for the store to take its settlement.
    Default 0 (answer first): the settlement is journaled and audited, then taken while
    the answer leaves, so no request pays a store round trip after its upstream call
    (docs/settlement.md, "Answer first"). A settlement the store cannot take is replayed
    from the journal, whatever this is."""
    shutdown_grace_s: SecondsOrZero = 30.0
    """On SIGTERM: how long in-flight requests and streams may run on (new connections
    are refused and ``/readyz`` fails at once); what is still running then is cancelled.
    The chart's ``terminationGracePeriodSeconds`` is derived from it."""
    max_header_bytes: Bytes = 64 * 1024
    """Largest request line plus headers; a larger head is answered 431 and closed."""
    header_timeout_s: Seconds = 10.0
    """A request's line and headers must arrive within this long (from the connection,
    or from its first byte on a kept-alive connection); else 408 and close."""
    body_timeout_s: Seconds = 60.0
    """The request body must arrive within this long after its headers; else the
    connection is closed (the request fails as a client disconnect)."""
    keep_alive_s: Seconds = 5.0
    """An idle kept-alive connection is closed after this long."""
    max_connections: Connections = 4096
    """Open connections (and requests) per process; beyond it new requests get 503."""
    metrics_token_ref: str | None = None
    """Reference to a bearer token ``/metrics`` requires (none: open, as before)."""
    metrics_team_labels: bool = False
    """Budget metrics carry the team *name* as a label only when true; by default a team
    is labelled by its opaque id alone (names can say who a customer is)."""
    alerts: AlertSettings = AlertSettings()
    """Budget alerts at 80/90/100 % of every money budget (see AlertSettings)."""
    refine_timeout_s: Seconds = 2.0
    """How long the gateway waits for a provider's token count when it refines an input
    bound (``models[].refine_input``); past it the byte bound stands (docs/bounds.md)."""
    refine_cache_entries: CacheEntries = 4096
    """Token counts kept in memory per process (least recently used dropped first),
    keyed by a hash of deployment, model and the request's prefix, so a session's
    re-sent prefix is counted once (docs/bounds.md, "Refined input bound")."""
    workers: Workers = 1
    """Server processes sharing this listening socket (local and shared profiles; the
    lease profile runs one). With more than one, ``mayu serve`` supervises them: each is
    a replica of its own, ``<replica_id>-<i>`` with its own journal and audit file
    (``journal-<replica>-<i>.jsonl``), all admitting against the same store (one SQLite
    file: every admission is one ``BEGIN IMMEDIATE`` transaction, so a limit holds
    across them as it does in one), ``/metrics`` summed over them, a worker that dies
    restarted, and what a worker left open resolved from its journal
    (docs/deploy.md, "Worker processes")."""
    trusted_proxies: list[str] = []
    """Addresses or networks (``10.0.0.5``, ``10.0.0.0/8``, ``::1``) of the proxies in
    front of the gateway: only a connection from one of them has its
    ``X-Forwarded-For`` (the client's address) and ``X-Forwarded-Proto`` (http or
    https) believed. None by default: the headers of any other peer are ignored."""
    console: ConsoleSettings = ConsoleSettings()
    """The console's sessions and sign-in (see ConsoleSettings)."""


class KeyStoreSettings(SettingsBase, frozen=True):
    type: Literal["sqlite", "postgres"] = "sqlite"
    path: str | None = None
    """SQLite file (local profile); default ``<data_dir>/mayu.db``."""


class GovernanceStoreSettings(SettingsBase, frozen=True):
    type: Literal["local", "postgres"] = "local"
    path: str | None = None
    """SQLite file for local windows and permits; default ``<data_dir>/mayu.db``."""
    journal: bool = False
    """A local journal; refused in shared mode (ADR-046)."""
    max_batch: BatchSize = 64
    """Local (and lease) profile: at most this many admissions and settlements pending
    at once share one SQLite transaction (each still decided on its own, in order). A
    lone one always runs at once. 1: every operation its own transaction."""
    retention_days: Annotated[int, msgspec.Meta(ge=1, le=36500)] | None = None
    """Request-log retention: settled permits (and their segments and facts) admitted
    more than this many days ago are deleted hourly, once their month window has ended
    (never a pending permit, never one of the current UTC month). None: kept forever.
    ``mayu permits prune`` prunes on demand (gateway/governance/_retention.py)."""


class DatabaseSettings(SettingsBase, frozen=True):
    dsn_ref: str = "env:INFERPLANE_DATABASE_URL"
    pool_min_size: PoolSize = 2
    pool_max_size: PoolSize = 10
    connect_timeout_s: Seconds = 2.0
    pool_timeout_s: Seconds = 2.0
    """How long a request waits for a pooled connection (with coalescing: for a call to
    carry it) before a 503."""
    statement_timeout_s: SecondsOrZero = 5.0
    """Postgres ``statement_timeout`` of the gateway's pooled sessions (and inferplaned's):
    a statement that has a connection but no answer (a locked table, a stalled database)
    is cancelled after this long, so an admission or settlement takes at most
    ``pool_timeout_s`` + this, then a 503 (a settlement goes to the journal replay).
    0: none set. Not applied to ``mayu migrate`` nor to the command-line tools."""
    policy_refresh_s: Seconds = 1.0
    admission_coalesce: Coalesce = 1
    """Coalesce admissions: at most this many admission calls in flight per replica;
    requests arriving while all are busy go together as the next call. 0: off (every
    admission is its own call). Default 1: best for a hot team in tests/bench/coalesce.py
    (see docs/configuration.md)."""
    settlement_coalesce: Coalesce = 1
    """Coalesce settlements the same way: at most this many settlement calls in flight
    per replica; settlements arriving meanwhile are taken in one transaction. 0: off.
    Default 1: on one hot team from three processes, admissions/s ×1.47 in
    tests/bench/hotteam.py (docs/batching.md)."""
    merge_batches: bool = False
    """With both coalescings on: admissions and settlements share one lane of
    ``admission_coalesce`` calls in flight, and those waiting at once go as ONE
    transaction, settlements first (``inferplane_settle_admit_v2``): one commit per
    admit + settle pair on a hot team. Default off: tests/bench/hotteam.py found no
    consistent gain over two lanes (one lane has half the calls in flight)."""


class ProviderSettings(SettingsBase, frozen=True):
    name: str
    kind: Literal["openai", "anthropic", "mock", "azure", "vertex", "bedrock"]
    base_url: str | None = None
    api_key_ref: str | None = None
    credentials: Credentials | None = None
    """How the provider authenticates beyond ``api_key_ref``
    (``gateway/config/_credentials.py``)."""
    api_version: str | None = None
    """azure only: the ``api-version`` query parameter (required by the deployment form,
    ``…/openai``; optional on the v1 API, ``…/openai/v1``): docs/azure.md."""
    timeout_s: Seconds = 600.0
    connect_timeout_s: Seconds = 10.0
    max_connections: Connections = 200
    latency_ms: Millis = 0
    """mock only: delay before the first byte and between stream chunks."""


RefineInput = Literal["on_shortfall", "always", "off"]


class Deployment(SettingsBase, frozen=True):
    provider: str
    upstream_model: str | None = None
    """The model name sent upstream (default: the gateway's model name)."""
    refine_input: RefineInput | None = None
    """Overrides ``models[].refine_input`` for this deployment (unset: the model's)."""
    default_output_tokens: Tokens | None = None
    """Overrides ``models[].default_output_tokens`` for this deployment (unset: the
    model's)."""
    name: str | None = None
    """How routing, the usage log and metrics name it (default ``provider/upstream_model``)."""
    weight: Weight = 1
    """Its share of new requests under ``routing.strategy: weighted`` (0: fallback only)."""
    max_inflight: InFlight | None = None
    """Requests in flight at most before routing prefers another (its headroom)."""
    price: ModelPrice | None = None
    """This deployment's own prices (a region or cloud may charge more); unset: the
    model's. Each attempt is bounded, admitted and settled at its deployment's price."""

    def __post_init__(self) -> None:
        check_deployment_price(self.price)


class ModelSettings(SettingsBase, frozen=True):
    name: str
    deployments: list[Deployment]
    """Tried in order (or as ``routing`` orders them); each attempt gets its own permit."""
    routing: RoutingSettings | None = None
    """Balancing, health and cache affinity (``gateway/config/_routing.py``); unset: the
    listed order, every request from the first deployment."""
    catalog: str | None = None
    """The built-in catalog model (id or snapshot) whose figures this model takes for every
    price class, ``max_input_tokens`` and ``max_output_tokens`` the file does not set
    (``gateway/config/_models.py``). Unset: the catalog entry named like the model, if
    any. Deployments without ``upstream_model`` then send this id upstream."""
    price: ModelPrice = ModelPrice()
    max_output_tokens: Tokens = 8192
    """Output ceiling used for the bound when the request does not set max_tokens."""
    input_overhead_tokens: TokensOrZero = 1024
    """Input tokens a provider adds to any request beyond its body (chat template, the
    tool-use system prompt: 346 tokens for Claude with tools); added to the body-length
    input bound so an ordinary request with tools never reports more than its bound."""
    refine_input: RefineInput = "on_shortfall"
    """When the input bound is refined with the provider's own token count (Anthropic
    deployments: ``POST /v1/messages/count_tokens``): ``on_shortfall`` only when the
    byte bound would be refused or cut by budget fit, ``always`` before every admission,
    ``off`` never (docs/bounds.md, "Refined input bound")."""
    default_output_tokens: Tokens | None = None
    """Opt-in output cap for chat-completions and Responses requests that name no output
    limit: the gateway writes this limit into the body it forwards
    (``max_completion_tokens`` / ``max_output_tokens``), bounds the output by it and says
    so in ``x-inferplane-output-cap``. A client's own limit is never raised. Unset (the
    default): such requests are bounded by ``max_output_tokens`` and forwarded as sent.
    At most ``max_output_tokens`` and ``server.max_output_tokens`` (docs/bounds.md,
    "An opt-in output cap")."""
    count_allowance_pct: Percent = 5
    """Added to a provider's token count (at least 64 tokens): the count "may differ by
    a small amount" from what the message bills (Anthropic, *Token counting*). A request
    with tools also adds ``input_overhead_tokens`` (the tool-use system prompt)."""
    max_input_tokens: Tokens | None = None
    """The model's context window. Bounds the input of requests that make the provider add
    input the body does not carry (previous_response_id, files, image URLs, server tools);
    without it such requests are refused (400), since their cost cannot be bounded."""


class ControlPlaneSettings(SettingsBase, frozen=True):
    """The lease profile (ADR-034): policies and budget leases from inferplaned."""

    url: str
    """inferplaned's base URL, e.g. ``http://inferplaned:8470``."""
    token_ref: str | None = None
    """Reference to a data plane token (inferplaned ``auth.dataplane_tokens_ref``);
    unset only against an unauthenticated, loopback-only control plane."""
    dataplane_id: str | None = None
    """How this plane names itself to the control plane (``GET /v1alpha1/dataplanes``):
    a name, or ``env:NAME`` (e.g. the node name from the downward API). Unique per plane:
    its ledger rows are keyed by it. Default: ``server.replica_id``, else the host name,
    chosen on the first start and then kept with the counter store."""
    timeout_s: Seconds = 5.0
    """How long one heartbeat may take before it counts as failed."""
    min_heartbeat_interval_s: Seconds = 0.05
    """Spacing of early heartbeats (a lease missing or used up asks for one at once)."""
    max_heartbeat_interval_s: Seconds = 60.0
    """Longest pause between heartbeats, whatever cadence the control plane asks for:
    how late a newly published policy may reach this plane when no lease is renewed
    sooner (the control plane asks for the tightest lease ``renewInterval``, else 60 s)."""


class BootstrapTeam(SettingsBase, frozen=True):
    name: str
    rpm: Rate | None = None
    tpm: Rate | None = None
    tokens_per_day: Limit | None = None
    usd_micros_per_day: Limit | None = None
    usd_micros_per_month: Limit | None = None


class Settings(SettingsBase, frozen=True):
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
    guardrails: GuardrailSettings = GuardrailSettings()
    """PII and secrets masked, pseudonymized or blocked (docs/guardrails.md); off."""
    identity: IdentitySettings | None = None
    """OIDC issuers and the gateway credentials accepted (docs/identity.md); unset: keys only."""
    telemetry: TelemetrySettings | None = None
    """OpenTelemetry spans and metrics over OTLP/HTTP (docs/telemetry.md); unset: off."""

    @property
    def shared(self) -> bool:
        return self.key_store.type == "postgres" and self.governance_store.type == "postgres"
