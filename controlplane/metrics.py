"""inferplaned's Prometheus metrics (served at ``GET /metrics`` to reader and writer tokens).

What an operator alarms on in the lease profile: heartbeats refused before any figure
moved (a token reporting for a plane id that is not its own, a second counter store
for a live plane, fresh counters too often), frame changes accepted (each one turns a
plane's unused allowance into liability for the rest of its window), and account
reports the ledger refused or ignored (committed going backwards, a window or team the
plane cannot have, too many accounts, a team its token was not granted: an alarm).
Each app has its own registry, so several apps in one process (tests) never collide.
Label values come from fixed sets (the reasons below), never from a plane, token or team
name.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

SYNC_REFUSALS = ("plane_not_allowed", "token_conflict", "frame_live", "frame_rate")
"""Why a whole heartbeat was refused (403 or 409)."""
ACCOUNT_REFUSALS = ("went_backwards", "not_managed", "too_many_accounts", "period", "team",
                    "scope", "key", "duplicate", "not_granted")
"""Why one reported account was refused or ignored (the heartbeat itself is answered)."""


class ControlPlaneMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.heartbeats = Counter(
            "inferplaned_lease_heartbeats", "Lease heartbeats applied (stale retries "
            "included).", registry=self.registry)
        self.sync_refusals = Counter(
            "inferplaned_lease_sync_refusals", "Lease heartbeats refused before any figure "
            "moved, by reason.", ["reason"], registry=self.registry)
        self.frame_changes = Counter(
            "inferplaned_lease_frame_changes", "New counter stores (frames) accepted for "
            "a known data plane: each adopts its counters and strands its unused "
            "allowance as liability.", registry=self.registry)
        self.account_refusals = Counter(
            "inferplaned_lease_account_refusals", "Reported accounts refused or ignored "
            "by the ledger, by reason.", ["reason"], registry=self.registry)
        for reason in SYNC_REFUSALS:
            self.sync_refusals.labels(reason=reason)
        for reason in ACCOUNT_REFUSALS:
            self.account_refusals.labels(reason=reason)

    def render(self) -> bytes:
        return generate_latest(self.registry)
