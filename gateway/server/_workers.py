"""``mayu serve`` with ``server.workers: N`` > 1: N gateway processes on one port.

The process ``mayu serve`` started becomes a supervisor: it binds the port once (and
holds it while workers come and go), makes a directory for the workers' metric files
(``PROMETHEUS_MULTIPROC_DIR``, so any worker's ``/metrics`` serves the sum over all of
them; one a killed supervisor left behind is removed at the next start) and starts N
workers, each a fresh interpreter (``spawn``, not ``fork``) running
the app. On Linux each worker listens on a socket of its own bound to that port
(``SO_REUSEPORT``), so the kernel spreads new connections evenly over the workers; on
one shared listening socket, asyncio's accept loop lets whichever worker wakes first
take a whole burst of new connections (up to its backlog), and it keeps them while they
are kept alive (98 of 103 requests in tests/e2e/test_serve_workers.py). Elsewhere the
workers share the supervisor's socket. Worker ``i`` is replica
``<replica_id>-<i>`` with its own journal and audit file (:mod:`gateway.replicas`), and
worker 0 resolves the journals no worker of this run owns (after the count changed).
In the local profile the other workers start once worker 0 serves: it starts the budget
gauge from the day's totals, which must not already hold what they settled.

- All workers admit against the same store: in the local profile one SQLite file, where
  every admission and settlement is one ``BEGIN IMMEDIATE`` transaction (the write lock
  is taken before the counters are read), so a limit holds across the workers exactly
  as it does within one; in the shared profile the database, as across replicas.
- SIGTERM or SIGINT: the supervisor passes SIGTERM to every worker, each drains as a
  single ``mayu serve`` does (``server.shutdown_grace_s``), and the supervisor exits once
  they have. SIGHUP is logged and ignored, as in one process.
- What ``mayu config check`` finds (secrets, the database) stops ``mayu serve`` before any
  worker starts. A worker that fails before it ever served (its journal locked by
  another gateway on the data dir, a store failing after those checks) stops them all
  (exit status 1), so a broken setup never loops; a worker that dies after it
  served is restarted (after 1 s, doubling up to 30 s while it keeps dying early) and
  resolves what it left open from its journal, like a restarted replica.
- Each worker asks the kernel for SIGTERM when the supervisor dies (``PR_SET_PDEATHSIG``),
  so a killed supervisor leaves no worker serving behind it.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

from gateway.config import ServerSettings, Settings
from gateway.errors import ConfigError
from gateway.metrics import MULTIPROCESS_DIR

log = logging.getLogger("mayu.server")

_FIRST_RESTART_S = 1.0
_MAX_RESTART_S = 30.0
_STEADY_S = 60.0
"""A worker that served this long before it died is restarted after the first delay
again (its earlier deaths are forgotten)."""
_PR_SET_PDEATHSIG = 1
_REUSE_PORT = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")
"""Each worker on a socket of its own, the kernel balancing connections over them (Linux
hashes each new connection to one of the listening sockets; elsewhere the option does
not balance, and the workers share the supervisor's socket)."""


@dataclass
class _Slot:
    index: int
    process: BaseProcess | None = None
    ready: Any = None  # a multiprocessing Event, set by the worker once it serves
    served: bool = False
    """It served at least once (a later death is a crash to restart, not a bad config)."""
    started_at: float = 0.0
    delay_s: float = _FIRST_RESTART_S
    restart_at: float | None = None
    announced: bool = False


def listen_socket(server: ServerSettings) -> socket.socket:
    """The bound socket that holds ``server.host:port`` while workers come and go (they
    call ``listen``: each on a socket of its own bound beside it with ``SO_REUSEPORT``
    where the kernel balances those, see :func:`worker_socket`; or on this one)."""
    sock = _bound(server, (server.host, server.port), reuse_port=False)
    if _REUSE_PORT:
        # Bound without SO_REUSEPORT first, so a port another process serves (even
        # another mayu serve of this user, whose group would take ours in) is refused
        # here as it is without workers; then the port is held with it.
        address = sock.getsockname()  # the port chosen for port 0; IPv6 keeps its scope
        sock.close()
        sock = _bound(server, address, reuse_port=True)
    sock.set_inheritable(True)
    return sock


def worker_socket(held: socket.socket) -> socket.socket:
    """The socket a worker listens on: its own, bound to the address ``held`` holds with
    ``SO_REUSEPORT`` (the supervisor's socket is closed in the worker); or ``held``."""
    if not _REUSE_PORT:
        return held
    own = _new_socket(held.family, reuse_port=True)
    own.bind(held.getsockname())
    held.close()
    return own


def _new_socket(family: socket.AddressFamily, *, reuse_port: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def _bound(server: ServerSettings, address: tuple[Any, ...], *,
           reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in server.host else socket.AF_INET
    sock = _new_socket(family, reuse_port=reuse_port)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"server.port: cannot listen on {server.host}:{server.port}: "
                          f"{exc.strerror}") from exc
    return sock


_METRICS_PREFIX = "mayu-metrics-"


def fresh_metrics_dir() -> str:
    """A new directory for the workers' metric files, named after this supervisor's pid
    (``mayu-metrics-<pid>-…`` in the temporary directory). A supervisor removes its own
    when it stops; one killed before it could (``kill -9``, a crash) left its directory
    behind, so what a supervisor no longer running left (its pid gone, or this very pid:
    a restarted container's supervisor often has the pid its predecessor had) is
    removed first. A directory of a live process, or another user's, is left alone."""
    base = tempfile.gettempdir()
    for stale in os.scandir(base):
        head, _, rest = stale.name.partition(_METRICS_PREFIX)
        pid = rest.split("-", 1)[0]
        if head or not pid.isdigit() or not stale.is_dir(follow_symlinks=False):
            continue
        if stale.stat(follow_symlinks=False).st_uid != os.getuid():
            continue
        if int(pid) == os.getpid() or not _running(int(pid)):
            log.info("removing %s, left by a supervisor no longer running", stale.path)
            shutil.rmtree(stale.path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{_METRICS_PREFIX}{os.getpid()}-")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def run_workers(settings: Settings, *, log_level: str) -> int:
    """Supervise ``settings.server.workers`` workers until SIGTERM/SIGINT; the exit
    status (0, or 1 when a worker failed before it ever served)."""
    count = settings.server.workers
    try:
        sock = listen_socket(settings.server)
    except ConfigError as exc:
        print(f"mayu: error: {exc.message}", file=sys.stderr)
        return 2
    metrics_dir = fresh_metrics_dir()
    os.environ[MULTIPROCESS_DIR] = metrics_dir  # inherited by the spawned workers
    ctx = multiprocessing.get_context("spawn")
    slots = [_Slot(i) for i in range(count)]
    state = {"stopping": False, "failed": False}

    def spawn(slot: _Slot) -> None:
        slot.ready = ctx.Event()
        slot.process = ctx.Process(
            target=_worker_main, name=f"mayu-worker-{slot.index}",
            args=(settings, slot.index, count, sock, slot.ready, log_level, os.getpid()))
        slot.process.start()
        slot.started_at, slot.restart_at, slot.announced = time.monotonic(), None, False

    def stop(sig: int, frame: FrameType | None) -> None:
        if not state["stopping"]:
            log.info("signal %s: stopping %d workers (each drains in up to %gs)",
                     signal.Signals(sig).name, count, settings.server.shutdown_grace_s)
        state["stopping"] = True
        for slot in slots:
            if slot.process is not None and slot.process.is_alive():
                os.kill(slot.process.pid or 0, signal.SIGTERM)

    def hangup(sig: int, frame: FrameType | None) -> None:
        log.warning("SIGHUP: reload is not supported (the config is read at startup); "
                    "still serving. Restart mayu serve to apply a new config.")

    previous = {s: signal.signal(s, h) for s, h in ((signal.SIGTERM, stop),
                                                   (signal.SIGINT, stop),
                                                   (signal.SIGHUP, hangup))}
    host, port = sock.getsockname()[:2]
    log.info("mayu: %d workers on http://%s:%d (pids below; Ctrl-C stops them)", count,
             host if ":" not in host else f"[{host}]", port)
    try:
        spawn(slots[0])
        if not settings.shared:
            # Local profile: worker 0 starts the budget gauge from the day's totals, so
            # the others serve only once it does (what they settled before its reading
            # would be counted twice in the summed gauge).
            while (not slots[0].ready.wait(0.05) and slots[0].process is not None
                   and slots[0].process.is_alive() and not state["stopping"]):
                pass
        if not state["stopping"] and (settings.shared or slots[0].ready.is_set()):
            for slot in slots[1:]:  # (worker 0 dead before serving: it stops them all)
                spawn(slot)
        while any(s.process is not None for s in slots):
            _supervise(slots, spawn, stop, state, metrics_dir)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 1 if state["failed"] else 0


def _supervise(slots: list[_Slot], spawn: Callable[[_Slot], None],
               stop: Callable[[int, FrameType | None], None], state: dict[str, bool],
               metrics_dir: str) -> None:
    """One turn: reap the workers that exited, restart those due, announce the ready."""
    from prometheus_client import multiprocess

    running = [s.process.sentinel for s in slots if s.process is not None]
    if running:
        wait(running, timeout=0.2)
    else:
        time.sleep(0.2)
    now = time.monotonic()
    for slot in slots:
        proc = slot.process
        if proc is not None and slot.ready.is_set() and not slot.announced:
            slot.served = slot.announced = True
            log.info("worker %d (pid %d) serving", slot.index, proc.pid)
        if proc is not None and not proc.is_alive():
            proc.join()
            multiprocess.mark_process_dead(proc.pid, metrics_dir)  # type: ignore[no-untyped-call]
            slot.process = None
            if state["stopping"]:
                continue
            if not slot.served:
                log.error("worker %d exited with status %s before it served; stopping "
                          "all workers (its log lines above say why)", slot.index,
                          proc.exitcode)
                state["failed"] = True
                stop(signal.SIGTERM, None)
                continue
            if now - slot.started_at > _STEADY_S:
                slot.delay_s = _FIRST_RESTART_S
            log.error("worker %d (pid %d) exited with status %s; restarting it in %gs",
                      slot.index, proc.pid, proc.exitcode, slot.delay_s)
            slot.restart_at = now + slot.delay_s
            slot.delay_s = min(_MAX_RESTART_S, slot.delay_s * 2)
        if (slot.process is None and slot.restart_at is not None and now >= slot.restart_at
                and not state["stopping"]):
            spawn(slot)


def _die_with_parent(parent: int) -> None:
    """Ask for SIGTERM when the supervisor dies (Linux); exit at once if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        sys.exit(0)


def _worker_main(settings: Settings, index: int, count: int, sock: socket.socket,
                 ready: Any, log_level: str, parent: int) -> None:
    """One worker: the app of replica ``<replica_id>-<index>`` on the supervisor's port."""
    _die_with_parent(parent)
    sock = worker_socket(sock)
    logging.basicConfig(level=log_level.upper(),
                        format=f"%(asctime)s %(levelname)s %(name)s [worker {index}]: "
                               "%(message)s")
    from gateway.app import create_app
    from gateway.server._run import serve

    app = create_app(settings, worker=(index, count), adopt_journals=True)
    started = serve(app, settings.server, log_level=log_level, sockets=[sock],
                    on_started=ready.set)
    sys.exit(0 if started else 1)
