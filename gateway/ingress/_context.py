"""The running gateway's components, as the request path sees them."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.alerts import AlertStore
from gateway.audit import AuditLog
from gateway.config import ModelSettings, Settings
from gateway.governance import GovernanceStore, Governor
from gateway.ingress._refine import Refiner
from gateway.keys import KeyStore, Principal
from gateway.metrics import Metrics
from gateway.policy import PolicySource
from gateway.providers import Provider

_MAX_PRINCIPALS = 10_000


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
    """Owns every permit's life; built over ``governance`` when not given (tests)."""
    models: dict[str, ModelSettings] = field(init=False)
    policy_reload: asyncio.Future[Any] | None = field(default=None, init=False)
    """The on-demand policy reload in flight, shared by every request that needs it."""
    principal_ttl_s: float = 0.0
    """How long a resolved Principal plans admitted requests (0: resolved each time);
    only where admission re-checks it (the shared profile, ``_prepare.principal_to_admit``)."""
    principals: dict[str, tuple[float, Principal]] = field(default_factory=dict, init=False)
    """Key hash → (when resolved, Principal), for ``principal_to_admit``."""
    refiner: Refiner | None = field(default=None, init=False)
    """Refines input bounds with a provider's count (``gateway.ingress._refine``)."""
    pool: Any = None
    """The shared profile's Postgres pool (the admin API reads the schema revision)."""
    alerts: AlertStore | None = None
    """Where budget alerts are recorded (None: alerts off; the admin API lists them)."""

    def remember_principal(self, key_hash: str, principal: Principal) -> None:
        if len(self.principals) >= _MAX_PRINCIPALS:  # bounded: drop the oldest
            self.principals.pop(next(iter(self.principals)))
        self.principals.pop(key_hash, None)
        self.principals[key_hash] = (time.monotonic(), principal)

    def __post_init__(self) -> None:
        self.models = {m.name: m for m in self.settings.models}
        server = self.settings.server
        self.refiner = Refiner(timeout_s=server.refine_timeout_s,
                               entries=server.refine_cache_entries)
        if self.governor is None:
            self.governor = Governor(self.governance)
