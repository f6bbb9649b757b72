"""The running gateway's components, as the request path sees them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.alerts import AlertStore
from gateway.audit import AuditLog
from gateway.config import ModelSettings, Settings
from gateway.governance import GovernanceStore, Governor
from gateway.identity import GatewayCredentials
from gateway.ingress._refine import Refiner
from gateway.ingress._renew import Resolver
from gateway.keys import KeyStore, Principal
from gateway.metrics import Metrics
from gateway.policy import PolicySource
from gateway.providers import Provider
from gateway.routing import Router
from gateway.telemetry import TELEMETRY_OFF, Telemetry


@dataclass
class Gateway:
    settings: Settings
    key_store: KeyStore
    governance: GovernanceStore
    policy: PolicySource
    providers: dict[str, Provider]
    metrics: Metrics
    audit: AuditLog
    admin_token: str | None = None
    governor: Governor = None  # type: ignore[assignment]
    """Owns every permit's life; built over ``governance`` (and ``resolver``) when not
    given (tests)."""
    models: dict[str, ModelSettings] = field(init=False)
    principal_ttl_s: float = 0.0
    """How long a resolved Principal plans admitted requests (0: resolved each time);
    only where admission re-checks it (the shared profile, ``Resolver.to_admit``)."""
    resolver: Resolver = None  # type: ignore[assignment]
    """Resolves keys (and again after a snapshot mismatch: the Governor's keys); built
    over ``key_store`` and ``policy`` when not given."""
    refiner: Refiner | None = field(default=None, init=False)
    """Refines input bounds with a provider's count (``gateway.ingress._refine``)."""
    pool: Any = None
    """The shared profile's Postgres pool (the admin API reads the schema revision)."""
    alerts: AlertStore | None = None
    """Where budget alerts are recorded (None: alerts off; the admin API lists them)."""
    credentials: GatewayCredentials | None = field(default=None, init=False)
    """Brokered gateway credentials, verified locally (``identity.broker``; None: keys only)."""
    router: Router = field(default_factory=Router)
    """Deployment health, load and session pins on this replica (``gateway.routing``)."""
    telemetry: Telemetry = TELEMETRY_OFF
    """Spans and OTLP metrics (``gateway.telemetry``); off unless configured."""

    @property
    def principals(self) -> dict[str, tuple[float, Principal]]:
        """Key hash → (when resolved, Principal): the resolver's cache."""
        return self.resolver.principals

    def __post_init__(self) -> None:
        self.models = {m.name: m for m in self.settings.models}
        if self.pool is not None:
            self.router.share(self.pool)  # cache-affinity pins shared by the replicas
        identity = self.settings.identity
        if identity is not None and identity.broker is not None:
            # A lease plane fetches the brokered key of a credential issued since its
            # last heartbeat (gateway/lease/_client.py).
            self.credentials = GatewayCredentials(
                identity.broker, on_new=getattr(self.policy, "await_brokered_key", None))
        server = self.settings.server
        self.refiner = Refiner(timeout_s=server.refine_timeout_s,
                               entries=server.refine_cache_entries)
        if self.resolver is None:
            self.resolver = Resolver(self.key_store, self.policy, self.metrics,
                                     principal_ttl_s=self.principal_ttl_s)
        if self.governor is None:
            self.governor = Governor(self.governance, keys=self.resolver)
