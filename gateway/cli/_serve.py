"""``mayu serve``: load settings, prepare the local profile, run the gateway (uvicorn).

On the local profile the first run creates a demo team and key (``demo: true``) and
prints the key once, with a curl line ready to paste.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

import msgspec

from gateway.config import Settings, load_settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the gateway")
    p.add_argument("--config", help="YAML config file (default: built-in local profile)")
    p.add_argument("--host", help="listen address (overrides server.host)")
    p.add_argument("--port", type=int, help="listen port (overrides server.port)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    p.set_defaults(func=_serve)


def _with_overrides(settings: Settings, args: argparse.Namespace) -> Settings:
    server = settings.server
    if args.host:
        server = msgspec.structs.replace(server, host=args.host)
    if args.port is not None:
        server = msgspec.structs.replace(server, port=args.port)
    return msgspec.structs.replace(settings, server=server)


async def _prepare_local(settings: Settings) -> str | None:
    """Declared teams, then the demo key on first run (plaintext, or None)."""
    from gateway.keys import ensure_demo, ensure_teams, open_key_store

    store = await open_key_store(settings)
    try:
        await ensure_teams(store, settings.bootstrap_teams)
        return await ensure_demo(store) if settings.demo else None
    finally:
        await store.close()


def _announce_demo(key: str, settings: Settings) -> None:
    base = f"http://{settings.server.host}:{settings.server.port}"
    model = settings.models[0].name if settings.models else "mock-gpt"
    print(f"mayu: created team 'demo' and its key (shown once, store it now):\n\n"
          f"    {key}\n\n"
          f"try it:\n"
          f"    curl -s {base}/v1/chat/completions -H 'Authorization: Bearer {key}' "
          f"-H 'content-type: application/json' "
          f"-d '{{\"model\":\"{model}\",\"max_tokens\":32,"
          f"\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'\n", flush=True)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app

    settings = _with_overrides(load_settings(args.config), args)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not settings.shared:
        key = asyncio.run(_prepare_local(settings))
        if key:
            _announce_demo(key, settings)
    app = create_app(settings)
    config = uvicorn.Config(app, host=settings.server.host, port=settings.server.port,
                            log_level=args.log_level, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    server.run()
    # uvicorn reports a failed startup (bad secret ref, unreachable store) by not
    # starting; make that a non-zero exit for scripts and supervisors.
    return 0 if server.started else 1


