"""Routing: which of a model's deployments serves a request (balancing, health, cache
affinity), from what this replica sees (``docs/routing.md``)."""

from gateway.routing._dedupe import Dedupe, Shared, VolatileStore
from gateway.routing._health import retry_after_s
from gateway.routing._router import Plan, Router, deployment_names
from gateway.routing._session import Session, session_of

__all__ = ["Dedupe", "Plan", "Router", "Session", "Shared", "VolatileStore",
           "deployment_names", "retry_after_s", "session_of"]
