"""``mayu serve``: load settings, prepare the stores, run the gateway (uvicorn).

Before the server starts: the checks ``mayu config check`` runs too
(:func:`gateway.cli._checks.preflight`: secret references, policy source, policy files,
one line per problem); in the shared profile the database must be at this version's
schema head (else one line naming ``mayu migrate``); teams
declared in ``bootstrap_teams`` are registered (in shared mode as immutable
declarations: a conflicting one refuses startup naming ``bootstrap_teams[i]``), and on
the local profile the first run creates a demo team and key (``demo: true``) and prints
the key once, with a curl line ready to paste. The server itself
(:func:`gateway.server.serve`) applies the HTTP limits and drains on SIGTERM within
``server.shutdown_grace_s``; with ``server.workers`` > 1 this process supervises that
many of them on one port (:mod:`gateway.server._workers`). A busy port is refused before
any of this, as one line (:func:`gateway.server.check_port`). ``--data-dir`` and
``--replica-id`` override the config's, so two gateways on one host share one config.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import msgspec

from gateway.cli._args import label, shown, text, whole
from gateway.config import Settings, load_settings
from gateway.errors import ConfigError, GovernanceUnavailable
from gateway.policy import PolicyInvalid


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the gateway")
    p.add_argument("--config", help="YAML config file (default: built-in local profile)")
    p.add_argument("--host", help="listen address (overrides server.host)")
    p.add_argument("--port", type=_port, help="listen port (overrides server.port; 0: any "
                   "free port)")
    p.add_argument("--workers", type=_workers, help="gateway processes on this port "
                   "(overrides server.workers; 1-64; local and shared profiles)")
    p.add_argument("--data-dir", type=text, metavar="DIR",
                   help="folder of this gateway's files: local stores, journal, audit "
                   "(overrides data_dir; default .mayu in the current folder)")
    p.add_argument("--replica-id", type=label, metavar="ID",
                   help="this process's replica id, naming its journal and audit file "
                   "(overrides server.replica_id; default the host name). Shared profile: "
                   "two gateways on one host and one config each take their own "
                   "--replica-id (local profile: their own --data-dir)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_serve)


def _port(text: str) -> int:
    return whole(text, high=65535)


def _workers(text: str) -> int:
    try:
        return whole(text, low=1, high=64)
    except argparse.ArgumentTypeError:
        label = text if text.isprintable() and len(text) <= 40 else shown(text)
        raise argparse.ArgumentTypeError(f"{label} is not a number of workers (1-64)"
                                         ) from None


def _with_overrides(settings: Settings, args: argparse.Namespace) -> Settings:
    server = settings.server
    if args.host:
        server = msgspec.structs.replace(server, host=args.host)
    if args.port is not None:
        server = msgspec.structs.replace(server, port=args.port)
    if args.replica_id is not None:
        server = msgspec.structs.replace(server, replica_id=args.replica_id)
    if args.data_dir is not None:
        settings = msgspec.structs.replace(settings, data_dir=args.data_dir)
    if args.workers is not None:
        if args.workers > 1 and settings.control_plane is not None:
            raise ConfigError("--workers: the lease profile runs one process per node "
                              "(its leases are the node's share of a budget); set 1")
        server = msgspec.structs.replace(server, workers=args.workers)
    return msgspec.structs.replace(settings, server=server)


async def _prepare(settings: Settings) -> str | None:
    """Everything checked or created before the server starts; the demo key or None.

    Policy files are validated as one set; declared teams are registered (shared
    profile: by immutable declaration, ``declare_teams``); on the local profile's first
    run the demo team and key are created. A problem raises before uvicorn starts, so
    it is reported as plain lines instead of a lifespan traceback.
    """
    from gateway.cli._checks import check_database, preflight
    from gateway.keys import ensure_demo, ensure_teams, open_key_store

    preflight(settings)
    check_database(settings)  # shared: reachable and migrated, before anything opens
    if settings.shared and not settings.bootstrap_teams:
        return None  # nothing to declare: the lifespan opens the database itself
    try:
        store = await open_key_store(settings)
    except GovernanceUnavailable as exc:
        raise ConfigError(f"database.dsn_ref: {exc.message}") from exc
    try:
        await ensure_teams(store, settings.bootstrap_teams)
        return await ensure_demo(store) if settings.demo and not settings.shared else None
    finally:
        await store.close()


def _announce_demo(key: str, settings: Settings, config: str | None) -> None:
    base = f"http://{settings.server.host}:{settings.server.port}"
    model = settings.models[0].name if settings.models else "mock-gpt"
    again = "mayu keys create --team demo" + (f" --config {config}" if config else "")
    print(f"mayu: created team 'demo' and its key (shown once, store it now; "
          f"`{again}` makes another):\n\n"
          f"    {key}\n\n"
          f"try it:\n"
          f"    curl -s {base}/v1/chat/completions -H 'Authorization: Bearer {key}' "
          f"-H 'content-type: application/json' "
          f"-d '{{\"model\":\"{model}\",\"max_tokens\":32,"
          f"\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'\n", flush=True)


def _serve(args: argparse.Namespace) -> int:
    from gateway.app import create_app
    from gateway.server import check_port, serve

    settings = _with_overrides(load_settings(args.config), args)
    check_port(settings.server.host, settings.server.port)  # busy: one line, nothing made
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        key = asyncio.run(_prepare(settings))
    except PolicyInvalid as exc:
        for path, message in exc.problems:  # one line per problem, no traceback
            print(f"mayu: error: policies: {path}: {message}", file=sys.stderr)
        return 2
    if key:
        _announce_demo(key, settings, args.config)
    if settings.server.workers > 1:
        from gateway.server import run_workers

        return run_workers(settings, log_level=args.log_level)
    app = create_app(settings, adopt_journals=True)
    started = serve(app, settings.server, log_level=args.log_level)
    # uvicorn reports a failed startup (bad secret ref, unreachable store) by not
    # starting; make that a non-zero exit for scripts and supervisors.
    return 0 if started else 1


