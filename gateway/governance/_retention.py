"""Request-log retention (``governance_store.retention_days``).

The request log is the permits themselves, so a long-running gateway's store grows by
one permit per request (361 bytes with its indexes in Postgres and 182 of facts,
tests/bench/requestlog.py). With a retention set, permits admitted more than that many
days ago are deleted, with the counters they charged (their segments) and the request
log's facts — but only settled ones, and only once their month window has ended: the
counters hold every open window's figures, and ``/v1/usage``, the summary and the log
must keep agreeing for the current day and month, so no permit of the current UTC month
is ever pruned (whatever the retention), and a pending permit (still binding its limits,
or waiting for an operator) never is.

The gateway prunes hourly in the background (in the shared profile one replica at a time:
a Postgres advisory lock) and ``mayu permits prune`` does it on demand, both in batches
of :data:`BATCH` permits per transaction.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Protocol

from gateway.governance._plan import utc_windows

log = logging.getLogger("mayu.governance")

BATCH = 5_000
"""Permits deleted per transaction (a short lock hold on a busy store)."""
INTERVAL_S = 3600.0
"""How often a gateway prunes (with a retention set)."""


class Prunable(Protocol):
    async def prune_permits(self, *, before: datetime, month: str, limit: int) -> int: ...


def cutoff(retention_days: int, now: datetime | None = None) -> tuple[datetime, str]:
    """(admitted before, month before): what :func:`prune` may delete at ``now``."""
    now = now or datetime.now(UTC)
    return now - timedelta(days=retention_days), utc_windows(now)[1]


async def prune(store: Prunable, retention_days: int, *, now: datetime | None = None,
                batch: int = BATCH) -> int:
    """Delete every permit past the retention (see the module docstring), a batch per
    transaction; returns how many."""
    before, month = cutoff(retention_days, now)
    total = 0
    while True:
        gone = await store.prune_permits(before=before, month=month, limit=batch)
        total += gone
        if gone < batch:
            return total


async def prune_forever(store: Prunable, retention_days: int,
                        interval_s: float = INTERVAL_S) -> None:
    """The gateway's background pruning: now, then every ``interval_s``; a failure is
    logged and tried again at the next interval."""
    while True:
        try:
            gone = await prune(store, retention_days)
            if gone:
                log.info("retention: pruned %d permits older than %d days (closed months "
                         "only)", gone, retention_days)
        except Exception as exc:  # the store may be down: next interval
            log.warning("retention: pruning failed (%s); trying again in %.0f s", exc,
                        interval_s)
        await asyncio.sleep(interval_s)
