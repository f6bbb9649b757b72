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
_COMMANDS = ("_serve", "_migrate", "_config", "_models", "_keys", "_import", "_policy", "_permits",
             "_mock")


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


def run_command(prog: str, args: argparse.Namespace) -> int:
    """Run the chosen sub-command; the exit codes every inferplane program uses.

    0 (or the command's own code) on success, 2 with ``<prog>: error: <message>`` on
    stderr for an :class:`InferplaneError` (bad config, bad input), 130 on Ctrl-C.
    """
    try:
        return int(args.func(args) or 0)
    except InferplaneError as exc:
        print(f"{prog}: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    return run_command("mayu", parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
