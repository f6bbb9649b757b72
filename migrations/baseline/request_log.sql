-- The request log's facts beyond a permit: the route a request came in by, the deployment
-- that answered it, the client tool its User-Agent names (claude-code, codex,
-- openai-python, …), the HTTP status the client got, and the tokens the upstream reported
-- per class. Written by the settlement's own statement (a data-modifying CTE beside the
-- settle call: no extra round trip), once per permit; a permit settled by the journal
-- replayer, at shutdown or by an operator may have none (the log shows them unknown).
-- Added after the last pre-release revision (0009): converting such a database creates
-- this table (gateway.schema.convert_prerelease).
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
-- A key's last use (the admin API's last_used_at): its newest permit.
CREATE INDEX permits_key_created_idx ON permits (key_id, created_at);
-- The request log without a key named, newest first: every team's page, a team's, a
-- time range's, a model's, a client tool's, an outcome's, the next page from its cursor
-- (read backwards from the page's position, not a sort of every permit); a time range's
-- summary; retention's oldest first. Admission time only grows, so an insert lands at
-- its right edge.
CREATE INDEX permits_created_idx ON permits (created_at, id);
