"""The agents' reports kept as long as the request log they are compared with.

With ``governance_store.retention_days: N`` the request log drops settled permits older
than N days of a month that has ended (gateway/governance/_retention.py); the reports go
by the same rule (by the agent's event time), so the usage API never sets a report
beside a request log already pruned, nor a pruned report beside a kept request.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from gateway.governance import cutoff
from gateway.otlp_import._store import ReportStore

log = logging.getLogger("mayu.otlp_import")

INTERVAL_S = 3600.0


def report_cutoff(retention_days: int, now: datetime | None = None) -> datetime:
    """Reports before this are past the retention: N days ago, and never in the
    current UTC month (the request log's rule)."""
    now = now or datetime.now(UTC)
    before, _ = cutoff(retention_days, now)
    month_start = now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0,
                                              microsecond=0)
    return min(before, month_start)


async def prune_reports_forever(store: ReportStore, retention_days: int, *,
                                interval_s: float = INTERVAL_S) -> None:
    """Prune now, then every ``interval_s``; a failure is logged and tried again."""
    while True:
        try:
            gone = await store.prune(before=report_cutoff(retention_days))
            if gone:
                log.info("retention: pruned %d agent usage reports older than %d days",
                         gone, retention_days)
        except Exception as exc:  # the store may be down: next interval
            log.warning("retention: pruning agent usage reports failed (%s); trying again "
                        "in %.0f s", exc, interval_s)
        await asyncio.sleep(interval_s)
