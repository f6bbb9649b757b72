"""What names a replica's own files: its journal, its audit file, and, with
``server.workers``, each worker process's.

A replica's journal is ``<data_dir>/journal-<replica>.jsonl`` (or ``server.journal_path``)
and only that replica reads it; its audit file is ``<data_dir>/audit-<replica>.jsonl``
(or ``server.audit_path``). A ``mayu serve`` with ``server.workers: N`` runs N replicas
on one host: worker ``i`` is replica ``<replica>-<i>``, its files numbered the same way
(``journal-host-0.jsonl``, or ``<stem>-<i><suffix>`` of a configured path).

When the number of workers changes between runs, some numbered journals belong to no
process any more (``journal-host-3.jsonl`` after going from 4 workers to 2; the plain
``journal-host.jsonl`` after going from 1 to 2; the numbered ones after going back to
1). Their permits must still be resolved, so the one process that adopts them (the
single process, or worker 0) resolves each at startup as its own replica would
(:func:`orphan_journals` lists them; a journal another live process holds is skipped by
its lock).
"""

from __future__ import annotations

import glob
import os
import socket

import msgspec

from gateway.audit import default_audit_path
from gateway.config import Settings


def replica_id(settings: Settings) -> str:
    return settings.server.replica_id or socket.gethostname()


def journal_path(settings: Settings) -> str:
    return os.path.expanduser(settings.server.journal_path or os.path.join(
        os.path.expanduser(settings.data_dir), f"journal-{replica_id(settings)}.jsonl"))


def audit_path(settings: Settings) -> str:
    return os.path.expanduser(settings.server.audit_path or default_audit_path(
        os.path.expanduser(settings.data_dir), settings.server.replica_id))


def _split(path: str) -> tuple[str, str]:
    stem, suffix = os.path.splitext(path)
    return stem, suffix


def numbered(path: str, index: int) -> str:
    """``/d/journal-host.jsonl`` → ``/d/journal-host-<index>.jsonl``."""
    stem, suffix = _split(path)
    return f"{stem}-{index}{suffix}"


def worker_settings(settings: Settings, index: int) -> Settings:
    """The settings of worker ``index``: replica ``<replica>-<index>``, its own journal
    and audit file."""
    server = settings.server
    replica = f"{replica_id(settings)}-{index}"
    audit = (numbered(audit_path(settings), index) if server.audit_path
             else default_audit_path(os.path.expanduser(settings.data_dir), replica))
    return msgspec.structs.replace(settings, server=msgspec.structs.replace(
        server, replica_id=replica, journal_path=numbered(journal_path(settings), index),
        audit_path=audit))


def orphan_journals(settings: Settings, worker: tuple[int, int] | None) -> list[str]:
    """Journals of this replica that no process of this run owns, for the adopter to
    resolve: ``worker`` is (index, count) of a worker of ``settings`` (the base
    settings, before :func:`worker_settings`), None for a single process. Only the
    single process and worker 0 adopt; the others get []."""
    if worker is not None and worker[0] != 0:
        return []
    base = journal_path(settings)
    stem, suffix = _split(base)
    found = [base] if worker is not None and os.path.exists(base) else []
    for path in glob.glob(glob.escape(stem) + "-*" + glob.escape(suffix)):
        tail = path[len(stem) + 1:len(path) - len(suffix)]
        if tail.isdigit() and (worker is None or int(tail) >= worker[1]):
            found.append(path)
    return sorted(found)
