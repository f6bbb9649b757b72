"""Routing: which of a model's deployments serves a request (balancing, health, cache
affinity, the soft tier), from what this replica sees (``docs/routing.md``)."""

from gateway.config import deployment_names
from gateway.routing._dedupe import Dedupe, Shared, VolatileStore
from gateway.routing._health import exhausted_s, retry_after_s
from gateway.routing._router import Plan, Router
from gateway.routing._session import Session, session_of
from gateway.routing._soft import STANDARD, SoftBudgets, TierChoice, choose_tier, lacks

__all__ = ["STANDARD", "Dedupe", "Plan", "Router", "Session", "Shared", "SoftBudgets",
           "TierChoice", "VolatileStore", "choose_tier", "deployment_names", "exhausted_s",
           "lacks", "retry_after_s", "session_of"]
