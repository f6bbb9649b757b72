-- Member and user budgets: what one person may spend within a team (team_members) and
-- across every team (users), on top of the team's and the key's own limits. A key's
-- user_name names its user. Admission charges a member's windows
-- (member:<team id>:<user>:…) and a user's (user:<user>:…) in the same all-or-none step
-- as every other counter (gateway.governance.plan_charges). Every edit of a member
-- moves its team's revision, and every edit of a user the revision of each team the user
-- holds a key in, so an admission planned with the old budget is re-planned
-- (snapshot_mismatch) rather than charged against it.
-- Added after the last pre-release revision (0009): converting such a database creates
-- these tables (gateway.schema.convert_prerelease).
CREATE TABLE users (
    name                 text PRIMARY KEY,
    email                text,
    display_name         text,
    tokens_per_day       bigint CHECK (tokens_per_day >= 0),
    usd_micros_per_day   bigint CHECK (usd_micros_per_day >= 0),
    usd_micros_per_month bigint CHECK (usd_micros_per_month >= 0),
    revision             bigint NOT NULL DEFAULT 1,
    created_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at           timestamptz NOT NULL DEFAULT clock_timestamp()
);

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
CREATE INDEX keys_user_idx ON keys (user_name) WHERE user_name IS NOT NULL;
