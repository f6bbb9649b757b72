"""``mayu policy``: check GovernancePolicy files before they are deployed.

``mayu policy validate FILE…`` validates the files as one set (as the gateway loads
them: duplicate uids across files are errors) and prints every problem with its file,
document and field path; exit status 1 if there is any. ``mayu policy effective`` shows
the most-restrictive-wins limits a caller would get.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence

import msgspec

from gateway.cli._commands import add_command, command_group
from gateway.policy import CompiledRule, check_files, compile_documents, effective_limits


def _summary(rules: Sequence[CompiledRule]) -> str:
    counts = Counter(r.kind for r in rules)
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no rules"
    unlimited = sum(1 for r in rules if r.unlimited)
    return kinds + (f"; {unlimited} unlimited" if unlimited else "")


def _validate(args: argparse.Namespace) -> int:
    docs, origins, problems = check_files(args.files)
    if problems:
        for path, msg in problems:
            print(f"{path}: {msg}")
        count = len(problems)
        print(f"{count} problem{'s' * (count != 1)} found; nothing would be applied",
              file=sys.stderr)
        return 1
    rules = compile_documents(docs, origins=origins)
    for doc, origin in zip(docs, origins, strict=True):
        name = doc["metadata"]["name"]
        mine = [r for r in rules if r.policy == name]
        print(f"ok  {origin}: {name}: {len(mine)} rule{'s' * (len(mine) != 1)} "
              f"({_summary(mine)})")
    return 0


def _effective(args: argparse.Namespace) -> int:
    docs, origins, problems = check_files(args.files)
    if problems:
        for path, msg in problems:
            print(f"{path}: {msg}")
        return 1
    merged = effective_limits(compile_documents(docs, origins=origins), args.team, args.user)
    print(msgspec.json.format(msgspec.json.encode(merged)).decode())
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = command_group(
        subparsers, "policy", metavar="SUBCOMMAND", summary="validate GovernancePolicy files",
        description="Check GovernancePolicy (inferplane.dev/v1alpha1) YAML files.")
    validate = add_command(
        sub, "validate", _validate, summary="validate policy files as one set",
        description="Validate the files as one policy set and print every problem with "
        "its file, document and field path. Exit 1 if any problem is found; otherwise "
        "print one summary line per document.")
    validate.add_argument("files", nargs="+", metavar="FILE", help="YAML file or glob")
    effective = add_command(
        sub, "effective", _effective,
        summary="show the effective (most-restrictive) limits for a caller",
        description="Merge the rules that apply to TEAM (and USER) most-restrictive-wins "
        "and print them as JSON (display only: enforcement charges every rule).")
    effective.add_argument("files", nargs="+", metavar="FILE", help="YAML file or glob")
    effective.add_argument("--team", required=True, help="team name")
    effective.add_argument("--user", default=None, help="user (optional)")
