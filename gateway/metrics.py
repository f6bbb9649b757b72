"""Prometheus metrics of one gateway process (served at ``/metrics``).

Each app gets its own registry, so several apps in one process (tests) never collide.
Money counters are integer µUSD; latency histograms are in seconds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1, 2.5, 5, 10, 30, 60)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.admissions = Counter("mayu_admissions", "Admission decisions by outcome "
                                  "(admitted, refused_429, refused_402, refused_503, error).",
                                  ["outcome"], registry=r)
        self.settlements = Counter("mayu_settlements", "Settlements by outcome kind.",
                                   ["kind"], registry=r)
        self.reserved_usd = Counter("mayu_reserved_micro_usd",
                                    "µUSD reserved by admitted permits (bounds).", registry=r)
        self.committed_usd = Counter("mayu_committed_micro_usd",
                                     "µUSD committed by settlements.", registry=r)
        self.admission_latency = Histogram("mayu_admission_seconds",
                                           "Time to admit or refuse one attempt.",
                                           buckets=_LATENCY_BUCKETS, registry=r)
        self.upstream_latency = Histogram("mayu_upstream_seconds",
                                          "Time to upstream response headers, by provider.",
                                          ["provider"], buckets=_LATENCY_BUCKETS, registry=r)
        self.snapshot_retries = Counter(
            "mayu_snapshot_retries", "Admissions re-planned after a snapshot mismatch, by "
            "what changed (key, team, policy).", ["changed"], registry=r)
        self.sync_errors = Counter("mayu_policy_sync_errors",
                                   "Policy source refresh failures, by kind.", ["kind"],
                                   registry=r)
        self.requests = Counter("mayu_requests", "Requests by route and status.",
                                ["route", "status"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
