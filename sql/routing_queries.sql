-- Cache affinity's shared pins (gateway/routing/_pins.py): read the best of a session's
-- keys, write a pin, forget expired ones.

-- name: pin_get
-- The deployment pinned under the first of %(keys)s (best first) that is still live.
SELECT deployment, extract(epoch FROM expires_at - now())::float8 AS ttl_s
FROM routing_pins
WHERE model = %(model)s AND session_key = ANY(%(keys)s) AND expires_at > now()
ORDER BY array_position(%(keys)s, session_key)
LIMIT 1;

-- name: pin_put
INSERT INTO routing_pins (model, session_key, deployment, expires_at)
VALUES (%(model)s, %(key)s, %(deployment)s, now() + make_interval(secs => %(ttl_s)s))
ON CONFLICT (model, session_key) DO UPDATE
SET deployment = EXCLUDED.deployment, expires_at = EXCLUDED.expires_at;

-- name: pin_sweep
DELETE FROM routing_pins WHERE expires_at < now();
