-- Named queries of the control plane's lease ledger (controlplane/leases.py).
-- Each query starts with a "-- name: <name>" line; parameters are %(name)s. The work is
-- done by the functions of sql/lease.sql, one round trip per call.

-- name: lease_sync
-- One heartbeat in one transaction: report, grants, data-plane record.
SELECT inferplane_lease_sync_v1(%(req)s::jsonb) AS result

-- name: lease_dataplanes
SELECT inferplane_lease_dataplanes_v1() AS planes
