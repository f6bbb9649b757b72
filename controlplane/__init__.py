"""inferplaned: the control plane (ADR-031).

Publishes GovernancePolicy documents as numbered, fingerprinted generations in the
shared Postgres database, attributed to the token that wrote them. Inference traffic
never passes through it. ``create_app(config)`` is the app factory; ``cli.main`` is the
``inferplaned`` console script.
"""

from controlplane.app import create_app
from controlplane.settings import ControlPlaneConfig, load_config

__all__ = ["ControlPlaneConfig", "create_app", "load_config"]
