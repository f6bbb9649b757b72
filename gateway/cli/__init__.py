"""``mayu``: the gateway's command line.

Each sub-command group lives in its own module exposing ``register(subparsers)``; this
module only assembles them, so ``mayu --help`` lists every command.

Every command answers bad input with one line on stderr and exit 2: a usage error
(argparse's, and every argument type's, :mod:`gateway.cli._args`) as
``mayu <command>: error: …``, an :class:`InferplaneError` as ``mayu: error: …``. A
command whose stdout is closed early (``mayu keys list | head -3``) stops quietly with
exit 141, what a shell reports for a program that SIGPIPE ended — without setting SIGPIPE
to its default action, which would kill ``mayu serve`` on any write to a closed socket.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from gateway.errors import InferplaneError

# Sub-command modules, in the order --help lists them.
_COMMANDS = ("_serve", "_migrate", "_config", "_models", "_keys", "_members", "_import",
             "_policy", "_permits", "_login", "_mock")


EXIT_PIPE = 141
"""Exit status when stdout was closed: 128 + SIGPIPE, as a shell reports ``git log | head``."""


class Parser(argparse.ArgumentParser):
    """argparse's parser with a one-line usage error (its sub-parsers are Parsers too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="mayu", description="inferplane gateway (data plane): serve, manage keys, "
        "teams, members and users, check config and policies.")
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
    try:
        code = run_command("mayu", build_parser().parse_args(argv))
        sys.stdout.flush()  # here, not at exit: a closed pipe is an exception we can catch
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_PIPE
    return code


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so what is still buffered flushes there at exit instead
    of failing again (Python's own advice for SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
