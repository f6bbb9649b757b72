"""``mayu mock-upstream``: the mock model as a real OpenAI/Anthropic-compatible server."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("mock-upstream",
                       help="serve the deterministic mock model over HTTP (tests, benches)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=4100)
    p.add_argument("--latency-ms", type=int, default=0,
                   help="delay before the first byte and between stream chunks")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.mock import create_mock_app

    uvicorn.run(create_mock_app(latency_ms=args.latency_ms), host=args.host, port=args.port,
                log_level="warning", access_log=False)
    return 0
