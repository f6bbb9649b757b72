"""What ``mayu serve`` checks and says before and while the server starts.

:func:`check_port`: the listen address is free, checked before anything is prepared (no
demo key made, no "mayu ready" logged) so a busy port is one line and a non-zero exit.
:func:`one_line_startup_failure`: a startup refused for a known reason (an
:class:`gateway.errors.InferplaneError`, which the lifespan logs as one line naming the
config key) is not followed by the lifespan's traceback; any other failure keeps it.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gateway.errors import ConfigError, InferplaneError

Message = MutableMapping[str, Any]
ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Message]],
                    Callable[[Message], Awaitable[None]]], Awaitable[None]]


def check_port(host: str, port: int) -> None:
    """Raise a one-line :class:`ConfigError` if ``host:port`` cannot be listened on.

    Binds as uvicorn will (the address family from the host's spelling,
    ``SO_REUSEADDR``, so a port left in TIME_WAIT is free) and closes at once; port 0
    (any free port) is never busy.
    """
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn chooses
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            why = exc.strerror or str(exc)
            if exc.errno == errno.EADDRINUSE:
                why += " (the port is busy: stop what listens there, or choose --port)"
            raise ConfigError(f"server.port: cannot listen on {host}:{port}: {why}") from exc


def _known(exc: BaseException) -> bool:
    """An InferplaneError, alone or inside the exception groups a lifespan raises."""
    if isinstance(exc, InferplaneError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_known(inner) for inner in exc.exceptions)
    return False


def one_line_startup_failure(app: ASGIApp) -> ASGIApp:
    """``app`` whose lifespan startup failure carries no traceback when its cause is an
    InferplaneError (uvicorn logs the failure message it is sent: the formatted
    traceback). The message is held until the exception that follows it is seen."""

    async def wrapped(scope: MutableMapping[str, Any],
                      receive: Callable[[], Awaitable[Message]],
                      send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        held: list[Message] = []

        async def hold_failure(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                held.append(message)
                return
            await send(message)

        try:
            await app(scope, receive, hold_failure)
        except BaseException as exc:
            if held and _known(exc):
                held[0] = {**held[0], "message": ""}
            raise
        finally:
            for message in held:
                await send(message)

    return wrapped
