"""The OpenAI- and Anthropic-shaped HTTP surface and the request path behind it."""

from gateway.ingress._asgi import GatewayApp
from gateway.ingress._attempt import Attempt, Call, outcome_for
from gateway.ingress._client import CLIENTS
from gateway.ingress._context import Gateway
from gateway.ingress._dispatch import InvalidUpstreamUsage, dispatch
from gateway.ingress._door import refuse_nul_bytes
from gateway.ingress._prepare import (
    ACTING_FOR,
    ActingFor,
    authenticate,
    presented,
)
from gateway.ingress._renew import Resolver
from gateway.ingress._routes import ROUTES, error_handler

__all__ = [
    "ACTING_FOR",
    "CLIENTS",
    "ROUTES",
    "ActingFor",
    "Attempt",
    "Call",
    "Gateway",
    "GatewayApp",
    "InvalidUpstreamUsage",
    "Resolver",
    "authenticate",
    "outcome_for",
    "presented",
    "dispatch",
    "error_handler",
    "refuse_nul_bytes",
]
