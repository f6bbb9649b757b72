"""``mayu``: the gateway's command line.

Each sub-command group lives in its own module exposing ``register(subparsers)``; this
module only assembles them, so ``mayu --help`` lists every command.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gateway.errors import InferplaneError

# Sub-command modules, in the order --help lists them.
_COMMANDS = ("_serve", "_config", "_keys", "_import", "_policy", "_mock")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mayu", description="inferplane gateway (data plane): serve, manage keys and "
        "teams, check config and policies.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMANDS:
        try:
            module = importlib.import_module(f"gateway.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"gateway.cli.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InferplaneError as exc:
        print(f"mayu: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
