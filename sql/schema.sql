-- inferplane's Postgres schema: every table and index of the shared and lease profiles.
--
-- The present, with sql/governance.sql and sql/lease.sql (the functions), installed in
-- that order (sql.SCHEMA). A database gets here by migrations: the 0.1.0 baseline
-- (migrations/baseline/) plus every revision after it; a table change is a new revision
-- AND an edit here, and tests/integration/test_schema_structure.py checks that the two
-- build the same schema (CONTRIBUTING.md).
--
-- Money and tokens are BIGINT (integer µUSD / tokens). A bucket balance is BIGINT in
-- units of 1/60_000_000 token (gateway.governance.BUCKET_SCALE).
--
-- The three figures (DESIGN §5) appear on every counter, account and permit: committed
-- (what the upstream reported), liability (the unobserved remainder of an uncertain
-- outcome's bound: it binds hard limits in its window like a reservation but is never
-- spend, and ends with its window) and reserved (in flight).

-- The persistent authority namespace: created once, never changed. A gateway verifies
-- that policy generations and leases come from THIS database, not merely equal policies.
CREATE TABLE authority_namespace (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    namespace  uuid NOT NULL DEFAULT gen_random_uuid(),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
INSERT INTO authority_namespace DEFAULT VALUES;

CREATE TABLE teams (
    id                   text PRIMARY KEY,
    name                 text NOT NULL UNIQUE,
    rpm                  bigint CHECK (rpm > 0),
    tpm                  bigint CHECK (tpm > 0),
    tokens_per_day       bigint CHECK (tokens_per_day >= 0),
    usd_micros_per_day   bigint CHECK (usd_micros_per_day >= 0),
    usd_micros_per_month bigint CHECK (usd_micros_per_month >= 0),
    region               text,
    guardrails           text[] NOT NULL DEFAULT '{}',
    revision             bigint NOT NULL DEFAULT 1,
    created_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Budget fit (opt-in): the smallest output allowance a request may be lowered to so
    -- its worst case fits the team's remaining money or token quota. NULL: refuse.
    budget_fit_floor     bigint CHECK (budget_fit_floor >= 0)
);

CREATE TABLE keys (
    id                   text PRIMARY KEY,
    team_id              text NOT NULL REFERENCES teams (id),
    key_hash             text NOT NULL UNIQUE,
    display_prefix       text NOT NULL,
    name                 text NOT NULL DEFAULT '',
    user_name            text,
    -- NULL = every model; an empty array = none.
    allowed_models       text[],
    rpm                  bigint CHECK (rpm > 0),
    tpm                  bigint CHECK (tpm > 0),
    usd_micros_per_day   bigint CHECK (usd_micros_per_day >= 0),
    usd_micros_per_month bigint CHECK (usd_micros_per_month >= 0),
    expires_at           timestamptz,
    -- A tombstone: revoked keys are never deleted, so an import or audit still sees them.
    revoked_at           timestamptz,
    revision             bigint NOT NULL DEFAULT 1,
    created_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The key inferplaned keeps for a user's brokered credentials in one team (their
    -- ``kh``): no secret of it exists; one active per user and team.
    brokered             boolean NOT NULL DEFAULT false
);
CREATE INDEX keys_team_idx ON keys (team_id);
CREATE INDEX keys_user_idx ON keys (user_name) WHERE user_name IS NOT NULL;
CREATE UNIQUE INDEX keys_brokered_idx ON keys (team_id, user_name)
    WHERE brokered AND revoked_at IS NULL;

-- Key rotations: a new secret for the same key (its id, limits, owner and spend stay),
-- made by POST /admin/v1/keys/{key_id}/rotate or `mayu keys rotate`. The secret a
-- rotation replaced keeps authenticating its key until old_valid_until (the grace), so
-- tools still holding it keep working while they are moved to the new one; a revoked key
-- authenticates with none. A rotation retried with the same Idempotency-Key finds its row
-- and answers the same new secret: derived as HMAC-SHA256(salt, Idempotency-Key), so the
-- database alone (salt and the key's SHA-256) cannot give it back.
CREATE TABLE key_rotations (
    key_id           text NOT NULL REFERENCES keys (id),
    revision         bigint NOT NULL,              -- the key's revision the rotation made
    old_key_hash     text NOT NULL UNIQUE,
    old_valid_until  timestamptz NOT NULL,
    new_key_hash     text NOT NULL,
    idempotency_hash text,                          -- SHA-256 of the Idempotency-Key
    salt             text,                          -- hex, with an Idempotency-Key only
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (key_id, revision)
);
CREATE UNIQUE INDEX key_rotations_idempotency_idx
    ON key_rotations (key_id, idempotency_hash) WHERE idempotency_hash IS NOT NULL;

-- Member and user budgets: what one person may spend within a team (team_members) and
-- across every team (users), on top of the team's and the key's own limits. A key's
-- user_name names its user. Admission charges a member's windows
-- (member:<team id>:<user>:…) and a user's (user:<user>:…) in the same all-or-none step
-- as every other counter (gateway.governance.plan_charges). Every edit of a member
-- moves its team's revision, and every edit of a user the revision of each team the user
-- holds a key in, so an admission planned with the old budget is re-planned
-- (snapshot_mismatch) rather than charged against it.
CREATE TABLE users (
    name                 text PRIMARY KEY,
    email                text,
    display_name         text,
    tokens_per_day       bigint CHECK (tokens_per_day >= 0),
    usd_micros_per_day   bigint CHECK (usd_micros_per_day >= 0),
    usd_micros_per_month bigint CHECK (usd_micros_per_month >= 0),
    revision             bigint NOT NULL DEFAULT 1,
    created_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The OIDC issuer and subject this user signed in as (one person, whatever their
    -- email becomes); revoked_at refuses their brokered credentials and exchanges.
    issuer               text,
    subject              text,
    revoked_at           timestamptz
);
CREATE UNIQUE INDEX users_identity_idx ON users (issuer, subject) WHERE issuer IS NOT NULL;

CREATE TABLE team_members (
    team_id              text NOT NULL REFERENCES teams (id),
    -- '*': the team's default member budget, for each user of the team without a row.
    user_name            text NOT NULL,
    tokens_per_day       bigint CHECK (tokens_per_day >= 0),
    usd_micros_per_day   bigint CHECK (usd_micros_per_day >= 0),
    usd_micros_per_month bigint CHECK (usd_micros_per_month >= 0),
    revision             bigint NOT NULL DEFAULT 1,
    created_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (team_id, user_name)
);

-- Replica bootstrap declarations: the immutable fingerprint of what a replica's config
-- first declared. A repeat is a no-op; a conflicting declaration refuses startup.
CREATE TABLE bootstrap_declarations (
    kind        text NOT NULL,
    name        text NOT NULL,
    fingerprint text NOT NULL,
    declared_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (kind, name)
);

-- The current policy generation (one row). Admission locks it FOR SHARE, publishing
-- FOR UPDATE, so a publish serialises against admissions without admissions
-- serialising on each other.
CREATE TABLE policy_state (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    generation  bigint NOT NULL DEFAULT 0,
    fingerprint text NOT NULL DEFAULT ''
);
INSERT INTO policy_state DEFAULT VALUES;

CREATE TABLE policy_generations (
    generation  bigint PRIMARY KEY,
    fingerprint text NOT NULL,
    -- The whole document set of this generation: {name: document}.
    documents   jsonb NOT NULL,
    author      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE policy_changes (
    id         bigserial PRIMARY KEY,
    generation bigint NOT NULL REFERENCES policy_generations (generation),
    name       text NOT NULL,
    action     text NOT NULL CHECK (action IN ('put', 'delete')),
    author     text NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    before     jsonb,
    after      jsonb
);
CREATE INDEX policy_changes_generation_idx ON policy_changes (generation);

-- Buckets (rpm/tpm) and calendar windows (tokens/µUSD) keyed by the stable counter key
-- the Python planner builds (gateway.governance.plan_charges).
CREATE TABLE counters (
    key        text PRIMARY KEY,
    kind       text NOT NULL CHECK (kind IN ('bucket', 'window')),
    dimension  text NOT NULL CHECK (dimension IN ('requests', 'tokens', 'usd')),
    "limit"    bigint,
    -- Buckets only: balance in BUCKET_SCALE units (may be negative: debt after a
    -- true-up) and the database time (µs since epoch) it was last refilled to.
    balance    bigint,
    updated_us bigint,
    "window"   text,
    reserved   bigint NOT NULL DEFAULT 0,
    committed  bigint NOT NULL DEFAULT 0,
    frozen     boolean NOT NULL DEFAULT false,
    liability  bigint NOT NULL DEFAULT 0
);
-- The cluster-wide gauges (gateway/cluster_metrics.py) read the current windows' money
-- budgets and the frozen counters at every scrape: indexed so a scrape does not scan
-- every window the database ever held.
CREATE INDEX counters_usd_window_idx ON counters ("window")
    WHERE kind = 'window' AND dimension = 'usd';
CREATE INDEX counters_frozen_idx ON counters (key) WHERE frozen;

-- Policy monetary budgets (ADR-045's authority accounts). leased_outstanding is what
-- lease grants (ADR-034) hold; shared admission competes with it for the same limit.
CREATE TABLE authority_accounts (
    key                text PRIMARY KEY,
    rule_uid           text,
    scope              text,
    window_period      text,
    "limit"            bigint,
    hard               boolean NOT NULL DEFAULT true,
    reserved           bigint NOT NULL DEFAULT 0,
    committed          bigint NOT NULL DEFAULT 0,
    leased_outstanding bigint NOT NULL DEFAULT 0,
    frozen             boolean NOT NULL DEFAULT false,
    liability          bigint NOT NULL DEFAULT 0
);
CREATE INDEX authority_accounts_window_idx ON authority_accounts (window_period);
CREATE INDEX authority_accounts_frozen_idx ON authority_accounts (key) WHERE frozen;

CREATE TABLE permits (
    id                  uuid PRIMARY KEY,
    request_id          text NOT NULL,
    key_id              text NOT NULL,
    team_id             text NOT NULL,
    user_name           text,
    model               text NOT NULL,
    token_bound         bigint NOT NULL,
    usd_bound           bigint NOT NULL,
    generation          bigint NOT NULL,
    day                 text NOT NULL,
    month               text NOT NULL,
    status              text NOT NULL DEFAULT 'pending' CHECK (status IN
                        ('pending', 'complete', 'tokens_known', 'uncertain', 'invalid',
                         'cancelled')),
    settle_fingerprint  text,
    detail              text,
    tokens_committed    bigint,
    usd_committed       bigint,
    -- Database time (µs) at which the buckets were charged: settlement reduces a credit
    -- by the refill the reservation's lifetime could have added.
    admitted_us         bigint NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    settled_at          timestamptz,
    tokens_liability    bigint,
    usd_liability       bigint,
    -- Valid usage above the admitted bound was committed in full (DESIGN §5).
    bound_exceeded      boolean NOT NULL DEFAULT false,
    -- When an operator or a provider figure resolved the permit's liability.
    resolved_at         timestamptz,
    -- The lease-profile plane whose usage record this is (POST /v1alpha1/usage, shipped
    -- after the plane settled it; counters and accounts are not charged by it: the
    -- plane's heartbeat reports its spend). NULL: admitted by the shared profile.
    plane               text
);
CREATE INDEX permits_team_month_idx ON permits (team_id, month);
CREATE INDEX permits_key_month_idx ON permits (key_id, month);
CREATE INDEX permits_pending_idx ON permits (created_at) WHERE status = 'pending';
-- A key's last use (the admin API's last_used_at): its newest permit.
CREATE INDEX permits_key_created_idx ON permits (key_id, created_at);
-- The request log without a key named, newest first: every team's page, a team's, a
-- time range's, a model's, a client tool's, an outcome's, the next page from its cursor
-- (read backwards from the page's position, not a sort of every permit); a time range's
-- summary; retention's oldest first. Admission time only grows, so an insert lands at
-- its right edge.
CREATE INDEX permits_created_idx ON permits (created_at, id);
-- One plane's request log (GET /admin/v1/requests?plane=…), newest first.
CREATE INDEX permits_plane_created_idx ON permits (plane, created_at)
    WHERE plane IS NOT NULL;

-- The request log's facts beyond a permit: the route a request came in by, the deployment
-- that answered it, the client tool its User-Agent names (claude-code, codex,
-- openai-python, …), the HTTP status the client got, and the tokens the upstream reported
-- per class. Written by the settlement's own call (inferplane_write_facts_v2: no extra
-- round trip), once per permit; a permit settled by the journal
-- replayer, at shutdown or by an operator may have none (the log shows them unknown).
CREATE TABLE permit_facts (
    permit_id            uuid PRIMARY KEY,
    route                text,
    deployment           text,
    client               text,
    http_status          integer,
    input                bigint,
    output               bigint,
    cache_read           bigint,
    cache_write_5m       bigint,
    cache_write_1h       bigint,
    cache_write_unknown  bigint
);

-- The tier that served a permit's attempt when it was not the model's usual deployments
-- ('soft': routing.soft_tier, a caller past a soft budget; docs/routing.md). Written by
-- its own statement after the settlement, once per permit; no row: the usual ones.
CREATE TABLE permit_tiers (
    permit_id  uuid PRIMARY KEY,
    tier       text NOT NULL
);

-- Every counter a permit charged, with the window and limit it captured, so settlement
-- never re-reads current policy (ADR-046: deletion and midnight cannot move a charge).
CREATE TABLE permit_segments (
    permit_id  uuid NOT NULL REFERENCES permits (id),
    counter    text NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('bucket', 'window', 'account')),
    dimension  text NOT NULL,
    amount     bigint NOT NULL,
    "limit"    bigint,
    "window"   text,
    rule_uid   text,
    hard       boolean NOT NULL DEFAULT true,
    committed  bigint,
    liability  bigint,
    PRIMARY KEY (permit_id, counter)
);

-- Budget alerts (ADR-050): one row per money budget (window or account), window and
-- threshold (80, 90, 100 percent of its limit, by committed + liability) the first time a
-- settlement brings it there. The primary key deduplicates across replicas: the replica
-- whose INSERT … ON CONFLICT DO NOTHING returns the row delivers the event (webhook,
-- metric, audit line) and records the delivery here.
CREATE TABLE alert_events (
    counter       text NOT NULL,
    "window"      text NOT NULL,
    threshold     smallint NOT NULL CHECK (threshold IN (80, 90, 100)),
    "limit"       bigint NOT NULL,
    -- The budget's figures when the threshold was first seen (µUSD).
    committed     bigint NOT NULL,
    liability     bigint NOT NULL,
    reserved      bigint NOT NULL,
    replica       text NOT NULL,
    first_seen_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    delivered_at  timestamptz,
    attempts      integer NOT NULL DEFAULT 0,
    last_error    text,
    PRIMARY KEY (counter, "window", threshold)
);

-- The lease ledger (ADR-034, made durable; DESIGN §6). Each lease-managed account (one
-- budget rule, one scope, one UTC window) keeps one lease_grants row per data plane, and
-- the account row carries the sums in leased_outstanding, so shared admission and lease
-- grants compete for one budget and a control-plane restart loses nothing. The functions
-- are in sql/lease.sql.
CREATE TABLE lease_dataplanes (
    id                 text PRIMARY KEY,
    -- The data-plane token the plane belongs to: another configured token may not sync
    -- for it.
    token_name         text NOT NULL,
    build              text NOT NULL DEFAULT '',
    api_versions       text[] NOT NULL DEFAULT '{}',
    -- The plane's counter-store identity, its process, and that process's heartbeat
    -- number: a heartbeat older than one already applied (same frame and boot, lower
    -- seq) changes nothing.
    frame              text NOT NULL,
    boot               text NOT NULL,
    seq                bigint NOT NULL,
    applied_generation bigint,
    rejections         jsonb NOT NULL DEFAULT '[]',
    heartbeat_ms       bigint,
    -- The first heartbeat of the current frame: a later new frame (after an adoption)
    -- is refused until the control plane's frame-change interval has passed since.
    first_heartbeat    timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_heartbeat     timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeats         bigint NOT NULL DEFAULT 0
);

CREATE TABLE lease_grants (
    account          text NOT NULL REFERENCES authority_accounts (key),
    dataplane        text NOT NULL REFERENCES lease_dataplanes (id),
    rule_uid         text,
    frame            text NOT NULL,
    committed        bigint NOT NULL DEFAULT 0 CHECK (committed >= 0),
    liability        bigint NOT NULL DEFAULT 0 CHECK (liability >= 0),
    reserved         bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    allowance        bigint NOT NULL DEFAULT 0 CHECK (allowance >= 0),
    prior_committed  bigint NOT NULL DEFAULT 0,
    prior_unobserved bigint NOT NULL DEFAULT 0,
    adoptions        bigint NOT NULL DEFAULT 0,
    renew_ms         bigint NOT NULL,
    expires_at       timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (account, dataplane)
);
CREATE INDEX lease_grants_dataplane_idx ON lease_grants (dataplane);

-- A signed-in console visitor's session (gateway/console). The cookie carries a random
-- id; only its sha256 and the sha256 of the credential signed in with are kept, so a
-- read of this table reveals neither. Shared by every replica: a sign-out or a revoked
-- credential ends the session everywhere.
CREATE TABLE console_sessions (
    id_sha256         bytea PRIMARY KEY,   -- sha256 of the random session id the cookie carries
    subject           text NOT NULL,       -- 'admin:<token name>' or 'key:<key id>'
    access            text NOT NULL CHECK (access IN ('write', 'read', 'key')),
    credential_sha256 bytea NOT NULL,      -- sha256 of the credential signed in with
    created_at        timestamptz NOT NULL DEFAULT now(),
    last_seen_at      timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL, -- absolute expiry
    ended_at          timestamptz           -- set by sign-out or revocation
);
CREATE INDEX console_sessions_credential_idx ON console_sessions (credential_sha256);
CREATE INDEX console_sessions_subject_idx ON console_sessions (subject);

-- Cache affinity's pins (gateway/routing, docs/routing.md): per model, an agent session's
-- key (a hash of its session header or cacheable prefix: never a payload) and the
-- deployment whose prompt cache it warmed, until the cache's TTL runs out. Shared by
-- every replica, so a session keeps its deployment whichever replica it reaches.
CREATE TABLE routing_pins (
    model        text NOT NULL,
    session_key  text NOT NULL,
    deployment   text NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (model, session_key)
);
CREATE INDEX routing_pins_expires_idx ON routing_pins (expires_at);

-- The agents' own usage reports (gateway/otlp_import, docs/telemetry.md): what Claude
-- Code or Codex exported about itself over OTLP to the gateway's receiver, one row per
-- reported event ('event': a log record such as claude_code.api_request; 'metric': a
-- delta data point of claude_code.token.usage / cost.usage), keyed by a stable event id
-- so a replayed export is stored once. Never billed: no counter, permit or account reads
-- it; the usage API sets it beside the request log (a large gap is traffic that
-- bypassed the gateway). Tokens per class and the agent's own cost estimate (µUSD) are
-- never negative.
CREATE TABLE client_usage_reports (
    event_id            text PRIMARY KEY,
    team_id             text NOT NULL,
    key_id              text NOT NULL,
    user_name           text,
    agent               text NOT NULL,   -- 'claude-code', 'codex', or the service.name
    signal              text NOT NULL CHECK (signal IN ('event', 'metric')),
    session_id          text,
    model               text,
    input_tokens        bigint NOT NULL CHECK (input_tokens >= 0),
    output_tokens       bigint NOT NULL CHECK (output_tokens >= 0),
    cache_read_tokens   bigint NOT NULL CHECK (cache_read_tokens >= 0),
    cache_write_tokens  bigint NOT NULL CHECK (cache_write_tokens >= 0),
    reported_cost_uusd  bigint CHECK (reported_cost_uusd >= 0),
    reported_at         timestamptz NOT NULL,
    received_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX client_usage_reports_team_idx ON client_usage_reports (team_id, reported_at);
CREATE INDEX client_usage_reports_key_idx ON client_usage_reports (key_id, reported_at);
