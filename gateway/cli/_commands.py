"""How a ``mayu`` command that has sub-commands is registered (``mayu keys create``,
``mayu permits list``, …): one parser for the group, whose chosen sub-command is
required, so every group reads the same in ``--help`` and refuses a bare ``mayu keys``
the same way."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def command_group(subparsers: Any, name: str, *, summary: str, description: str,
                  metavar: str = "COMMAND") -> Any:
    """Add ``mayu NAME`` (``summary`` in the command list, ``description`` in its own
    help) and return where its sub-commands go (chosen into ``NAME_command``)."""
    group: argparse.ArgumentParser = subparsers.add_parser(name, help=summary,
                                                           description=description)
    return group.add_subparsers(dest=f"{name}_command", metavar=metavar, required=True)


def add_command(sub: Any, name: str, func: Callable[[argparse.Namespace], int], *,
                summary: str, description: str | None = None,
                **options: Any) -> argparse.ArgumentParser:
    """Add the command ``name`` (``summary`` in its group's list, ``description`` or else
    ``summary`` in its own help) that runs ``func``; its flags are the caller's to add."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=summary, description=description or summary, **options)
    parser.set_defaults(func=func)
    return parser
