"""``mayu mock-upstream``: the mock model as a real OpenAI/Anthropic-compatible server."""

from __future__ import annotations

import argparse

from gateway.cli._args import whole


def _port(text: str) -> int:
    return whole(text, high=65535)


def _latency_ms(text: str) -> int:
    return whole(text, high=600_000, unit=" ms")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("mock-upstream",
                       help="serve the deterministic mock model over HTTP (tests, benches)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=4100, help="0-65535 (0: any free port)")
    p.add_argument("--latency-ms", type=_latency_ms, default=0,
                   help="delay before the first byte and between stream chunks (at most "
                        "600000)")
    p.add_argument("--prompt-cache", action="store_true",
                   help="bill Messages requests by a prompt cache kept in this process, as "
                        "one deployment's server cache (reads, 5m/1h writes; default: the "
                        "stateless half-read, half-write split)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.mock import create_mock_app

    uvicorn.run(create_mock_app(latency_ms=args.latency_ms,
                                prompt_cache=args.prompt_cache), host=args.host, port=args.port,
                log_level="warning", access_log=False)
    return 0
