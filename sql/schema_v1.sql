-- inferplane shared-governance schema, version 1 (ADR-046).
--
-- Installed by migrations/versions/0001_shared_governance.py. This file is frozen once
-- released: a schema change is a new file and a new revision, never an edit here.
--
-- Money and tokens are BIGINT (integer µUSD / tokens). A bucket balance is BIGINT in
-- units of 1/60_000_000 token (gateway.governance.BUCKET_SCALE).

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
    updated_at           timestamptz NOT NULL DEFAULT clock_timestamp()
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
    created_at           timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX keys_team_idx ON keys (team_id);

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
    frozen     boolean NOT NULL DEFAULT false
);

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
    frozen             boolean NOT NULL DEFAULT false
);

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
    admitted_us         bigint NOT NULL,
    -- Database time (µs) at which the buckets were charged: settlement reduces a credit
    -- by the refill the reservation's lifetime could have added.
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    settled_at          timestamptz
);
CREATE INDEX permits_team_month_idx ON permits (team_id, month);
CREATE INDEX permits_key_month_idx ON permits (key_id, month);
CREATE INDEX permits_pending_idx ON permits (created_at) WHERE status = 'pending';

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
    PRIMARY KEY (permit_id, counter)
);
