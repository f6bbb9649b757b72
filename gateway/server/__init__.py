"""The HTTP server around the app: uvicorn with header/body limits and a graceful drain."""

from gateway.server._protocol import GuardedHttpToolsProtocol, guarded_protocol
from gateway.server._run import GatewayServer, serve, uvicorn_config
from gateway.server._startup import check_port
from gateway.server._workers import run_workers

__all__ = ["GatewayServer", "GuardedHttpToolsProtocol", "check_port", "guarded_protocol",
           "run_workers", "serve", "uvicorn_config"]
