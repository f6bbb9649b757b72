"""Running the app under uvicorn: limits, graceful drain on SIGTERM, SIGHUP ignored.

On SIGTERM (or Ctrl-C) ``app.state.draining`` becomes True first (so ``/readyz`` answers
503 at once, and the settlement drain can read it; an ``on_drain`` hook may run too),
then uvicorn's own shutdown: it stops accepting (new connections are refused),
closes idle connections, lets in-flight requests and streams run for up to
``server.shutdown_grace_s``, cancels what is left, and runs the lifespan shutdown (which
closes the stores). A cancelled stream settles its own permit ("cut at shutdown", what
it relayed committed: ``gateway.ingress._dispatch``), and the lifespan's Governor waits
a moment for those before it settles what is still open
(:meth:`gateway.governance.Governor.close`), so each permit is settled once. SIGHUP, which
would kill the process by default, only logs that a reload is not supported.
"""

from __future__ import annotations

import logging
import math
import signal
import socket
import threading
from collections.abc import Callable, Generator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import uvicorn

from gateway.config import ServerSettings
from gateway.server._protocol import guarded_protocol
from gateway.server._startup import one_line_startup_failure

log = logging.getLogger("mayu.server")


class GatewayServer(uvicorn.Server):
    """uvicorn.Server that tells the app it is draining and survives SIGHUP."""

    def __init__(self, config: uvicorn.Config, *, on_drain: Callable[[], None],
                 on_started: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._on_drain = on_drain
        self._on_started = on_started
        self.hangups = 0

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._on_started is not None:
            self._on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            log.info("signal %s: draining (readiness off, no new connections; in-flight "
                     "requests have %gs)", signal.Signals(sig).name,
                     self.config.timeout_graceful_shutdown or 0)
            self._on_drain()
        super().handle_exit(sig, frame)

    def _hangup(self, sig: int, frame: FrameType | None) -> None:
        self.hangups += 1
        log.warning("SIGHUP: reload is not supported (the config is read at startup); "
                    "still serving. Restart the process to apply a new config.")

    @contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            with super().capture_signals():
                yield
            return
        previous = signal.signal(signal.SIGHUP, self._hangup)
        try:
            with super().capture_signals():
                yield
        finally:
            signal.signal(signal.SIGHUP, previous)


def uvicorn_config(app: Any, server: ServerSettings, *, log_level: str) -> uvicorn.Config:
    """The uvicorn configuration for ``server`` (host and port as given)."""
    return uvicorn.Config(
        app, host=server.host, port=server.port, log_level=log_level, access_log=False,
        lifespan="on",
        http=guarded_protocol(max_header_bytes=server.max_header_bytes,
                              header_timeout_s=server.header_timeout_s,
                              body_timeout_s=server.body_timeout_s),
        # Only the h11 parser reads this; set so the limit holds whichever parser runs.
        h11_max_incomplete_event_size=server.max_header_bytes,
        timeout_keep_alive=max(1, math.ceil(server.keep_alive_s)),
        limit_concurrency=server.max_connections,
        # uvicorn annotates int, but only hands it to asyncio.wait_for (any float).
        timeout_graceful_shutdown=server.shutdown_grace_s,  # type: ignore[arg-type]
        # X-Forwarded-For/-Proto only from server.trusted_proxies (uvicorn's default
        # believes any peer on 127.0.0.1, and FORWARDED_ALLOW_IPS from the environment).
        proxy_headers=True, forwarded_allow_ips=list(server.trusted_proxies),
    )


def serve(app: Any, server: ServerSettings, *, log_level: str,
          on_drain: Callable[[], None] | None = None,
          sockets: list[socket.socket] | None = None,
          on_started: Callable[[], None] | None = None) -> bool:
    """Run ``app`` (a Litestar app) until SIGTERM/SIGINT and a graceful drain.

    ``app.state.draining`` is False while serving and True from the signal on (so
    ``/readyz`` fails at once); ``on_drain`` runs right after it is set. ``sockets``:
    listen on these (a worker of :func:`gateway.server.run_workers`) instead of binding
    ``server.host:port``; ``on_started`` runs once the app is ready and listening.
    False if the server never started (a failed lifespan startup; one refused for a
    known reason logs its one line and no traceback).
    """
    app.state.draining = False

    def drain() -> None:
        app.state.draining = True
        if on_drain is not None:
            on_drain()

    config = uvicorn_config(one_line_startup_failure(app), server, log_level=log_level)
    runner = GatewayServer(config, on_drain=drain, on_started=on_started)
    runner.run(sockets=sockets)
    return bool(runner.started)
