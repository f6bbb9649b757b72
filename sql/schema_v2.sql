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
