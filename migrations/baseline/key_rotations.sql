-- Key rotations: a new secret for the same key (its id, limits, owner and spend stay),
-- made by POST /admin/v1/keys/{key_id}/rotate or `mayu keys rotate`. The secret a
-- rotation replaced keeps authenticating its key until old_valid_until (the grace), so
-- tools still holding it keep working while they are moved to the new one; a revoked key
-- authenticates with none. A rotation retried with the same Idempotency-Key finds its row
-- and answers the same new secret: derived as HMAC-SHA256(salt, Idempotency-Key), so the
-- database alone (salt and the key's SHA-256) cannot give it back.
-- Added after the last pre-release revision (0009): converting such a database creates
-- this table (gateway.schema.convert_prerelease).
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
