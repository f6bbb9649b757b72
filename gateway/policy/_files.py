"""The local policy source: GovernancePolicy YAML files with hot reload (``policies:``).

All or nothing (ADR-034 §4 contrasts this with the per-document control-plane path): the
whole file set is validated together, and one invalid document keeps the previous
snapshot in force while its problems are logged on one line, each with its file and field
path. At startup there is no previous snapshot, so :meth:`FilePolicySource.start` raises
:class:`PolicyInvalid` instead. A file is read as UTF-8 and its YAML checked for depth
(:data:`gateway.jsondepth.MAX_JSON_DEPTH`) and aliases before it is parsed, as
inferplaned checks a published body: the parser and the validator recurse once per level,
and an alias can make a document contain itself. Reload polls file mtimes (portable, no
inotify); the generation increments only when the applied set actually changes (by
fingerprint).
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gateway.errors import NestingTooDeep
from gateway.jsondepth import check_yaml_depth
from gateway.policy._compile import compile_all, compile_documents, fingerprint
from gateway.policy._compiled import EMPTY_SNAPSHOT, PolicySnapshot
from gateway.policy._tasks import BackgroundTask
from gateway.policy._validate import PolicyInvalid, Problem

log = logging.getLogger("gateway.policy")

Signature = tuple[tuple[str, int, int], ...]
_GLOB_CHARS = frozenset("*?[")


def expand(globs: Sequence[str]) -> tuple[list[str], list[Problem]]:
    """Files matched by ``globs`` (sorted, unique); a literal path that is missing is a
    problem, a glob that matches nothing is simply empty."""
    files: set[str] = set()
    problems: list[Problem] = []
    for pattern in globs:
        pattern = os.path.expanduser(pattern)
        if not _GLOB_CHARS & set(pattern):
            if os.path.isfile(pattern):
                files.add(pattern)
            else:
                problems.append((pattern, "no such file"))
            continue
        files.update(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    return sorted(files), problems


def _yaml_error(exc: yaml.YAMLError) -> str:
    """PyYAML's complaint on one line: where and what (its own text quotes the source
    over several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return " ".join(str(exc).split())


def load_files(paths: Sequence[str]) -> tuple[list[Any], list[str], list[Problem]]:
    """Parse every YAML document of every file: (documents, origin per document, problems).

    A file may hold several documents separated by ``---``; empty documents are skipped.
    """
    docs: list[Any] = []
    origins: list[str] = []
    problems: list[Problem] = []
    for path in paths:
        try:
            text = Path(path).read_bytes().decode("utf-8")
            check_yaml_depth(text, what="YAML")
            parsed = list(yaml.safe_load_all(text))
        except OSError as exc:
            problems.append((path, f"cannot read: {exc.strerror}"))
            continue
        except UnicodeDecodeError as exc:
            problems.append((path, f"not UTF-8 text (byte {exc.start})"))
            continue
        except NestingTooDeep as exc:
            problems.append((path, exc.message))
            continue
        except yaml.YAMLError as exc:
            problems.append((path, f"not valid YAML: {_yaml_error(exc)}"))
            continue
        present = [d for d in parsed if d is not None]
        for k, d in enumerate(present):
            docs.append(d)
            origins.append(path if len(present) == 1 else f"{path}#{k}")
    return docs, origins, problems


def check_files(globs: Sequence[str]) -> tuple[list[Any], list[str], list[Problem]]:
    """Expand, parse and validate; every problem names its file (and document, field)."""
    paths, problems = expand(globs)
    docs, origins, load_problems = load_files(paths)
    problems += load_problems
    try:
        compile_documents(docs, origins=origins)
    except PolicyInvalid as exc:
        problems += exc.problems
    return docs, origins, problems


def _signature(paths: Sequence[str]) -> Signature:
    out = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        out.append((p, st.st_mtime_ns, st.st_size))
    return tuple(out)


class FilePolicySource:
    """A :class:`PolicySource` over local YAML files, hot reloaded by polling mtimes."""

    def __init__(self, globs: Sequence[str], *, poll_s: float = 1.0,
                 namespace: str = "local") -> None:
        self._globs = list(globs)
        self._poll_s = poll_s
        self._namespace = namespace
        self._snapshot = EMPTY_SNAPSHOT
        self._seen: Signature | None = None
        self._poller = BackgroundTask("policy-file-poll")

    def snapshot(self) -> PolicySnapshot:
        return self._snapshot

    def reload(self, *, strict: bool = False) -> bool:
        """Re-read the files if any changed; True when a new generation was applied.

        Invalid sets are logged, one error line naming every problem (or raised when
        ``strict``), and the previous snapshot stays; the signature is remembered so one
        bad edit is logged once, not per poll.
        """
        paths, _ = expand(self._globs)
        signature = _signature(paths)
        if signature == self._seen and not strict:
            return False
        self._seen = signature
        docs, origins, problems = check_files(self._globs)
        if problems:
            if strict:
                raise PolicyInvalid(problems)
            log.error("policy files rejected, keeping generation %d: %s",
                      self._snapshot.generation, PolicyInvalid(problems).message)
            return False
        digest = fingerprint(docs)
        if digest == self._snapshot.fingerprint:
            return False
        rules, routing, guardrails = compile_all(docs, origins=origins)
        self._snapshot = PolicySnapshot(namespace=self._namespace,
                                        generation=self._snapshot.generation + 1,
                                        fingerprint=digest, rules=rules, routing=routing,
                                        guardrails=guardrails)
        log.info("policy generation %d applied (%d rules, %s)", self._snapshot.generation,
                 len(rules), digest[:12])
        return True

    async def start(self) -> None:
        """Load the set (raising :class:`PolicyInvalid` if invalid), then poll."""
        self.reload(strict=True)
        if self._poll_s > 0:
            self._poller.start(self._poll)

    async def stop(self) -> None:
        await self._poller.stop()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                await asyncio.to_thread(self.reload)
            except Exception:  # a reload bug must not kill hot reload for good
                log.exception("policy reload failed; keeping generation %d",
                              self._snapshot.generation)
