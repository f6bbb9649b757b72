-- inferplane shared-governance schema, version 2: the three figures (DESIGN §5).
--
-- Installed by migrations/versions/0002_liability.py on top of schema_v1. Frozen once
-- released, like every _vN file.
--
-- liability: the unobserved remainder of an uncertain outcome's bound. It binds hard
-- limits in the window it was admitted in exactly like a reservation (admission checks
-- committed + reserved + liability), but it is never spend: committed stays what the
-- upstream reported. A window's liability ends with its window (a new window is a new
-- row). Existing rows start at 0: an upgrade changes no committed figure.

ALTER TABLE counters ADD COLUMN liability bigint NOT NULL DEFAULT 0;
ALTER TABLE authority_accounts ADD COLUMN liability bigint NOT NULL DEFAULT 0;

ALTER TABLE permits ADD COLUMN tokens_liability bigint;
ALTER TABLE permits ADD COLUMN usd_liability bigint;
-- Valid usage above the admitted bound was committed in full (DESIGN §5).
ALTER TABLE permits ADD COLUMN bound_exceeded boolean NOT NULL DEFAULT false;
-- Who/what resolved an uncertain permit's liability later (an operator, a provider figure).
ALTER TABLE permits ADD COLUMN resolved_at timestamptz;

ALTER TABLE permit_segments ADD COLUMN liability bigint;

-- Budget fit (opt-in per team): the smallest output allowance a request may be lowered
-- to so its worst case fits the team's remaining money or token quota. NULL: refuse.
ALTER TABLE teams ADD COLUMN budget_fit_floor bigint CHECK (budget_fit_floor >= 0);

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

-- The cluster-wide gauges (gateway/cluster_metrics.py) read the current windows' money
-- budgets and the frozen counters at every scrape (cached 5 s): indexed so a scrape does
-- not scan every window the database ever held.
CREATE INDEX counters_usd_window_idx ON counters ("window")
    WHERE kind = 'window' AND dimension = 'usd';
CREATE INDEX counters_frozen_idx ON counters (key) WHERE frozen;
CREATE INDEX authority_accounts_window_idx ON authority_accounts (window_period);
CREATE INDEX authority_accounts_frozen_idx ON authority_accounts (key) WHERE frozen;
