"""The running gateway's components, as the request path sees them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from gateway.audit import AuditLog
from gateway.config import ModelSettings, Settings
from gateway.governance import GovernanceStore, Governor
from gateway.keys import KeyStore
from gateway.metrics import Metrics
from gateway.policy import PolicySource
from gateway.providers import Provider


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

    def __post_init__(self) -> None:
        self.models = {m.name: m for m in self.settings.models}
        if self.governor is None:
            self.governor = Governor(self.governance)
