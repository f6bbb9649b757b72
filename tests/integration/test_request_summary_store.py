"""The request summary as the stores add it up (``request_summary``: one GROUP BY in
Postgres and in SQLite) equals the request log's rows added up one by one, as
``/v1/usage`` counts them: a settled permit its committed and, apart, its liability; a
pending or invalid one its bounds as reserved; a cancelled one no request. Both stores,
every grouping and bucket, with permits of every outcome and two teams, users and keys.
"""

from __future__ import annotations

import itertools
from datetime import UTC
from typing import Any

import pytest

from gateway.governance import LogFilter, Outcome, OutcomeKind, Permit, PermitInfo
from gateway.pricing import Usage
from tests.integration._pg_helpers import principal, request
from tests.integration.test_cli_permits import LIMITS, Backend, backend
from tests.settling import exact, settlement

pytestmark = pytest.mark.integration
__all__ = ["backend"]  # the fixture (both stores), shared with test_cli_permits
GROUPS = ("team", "user", "key", "model")
SUMS = ("requests", "tokens_committed", "usd_committed", "tokens_liability",
        "usd_liability", "tokens_reserved", "usd_reserved")
FIELD = {"team": "team_id", "user": "user", "key": "key_id", "model": "model"}


def oracle(rows: list[PermitInfo], groups: tuple[str, ...],
           bucket: str) -> dict[tuple[Any, ...], dict[str, int]]:
    """The summary added up in Python, one permit at a time."""
    out: dict[tuple[Any, ...], dict[str, int]] = {}
    for p in rows:
        at = p.created_at.astimezone(UTC)
        period = (None if bucket == "none" else at.strftime("%Y-%m-%d") if bucket == "day"
                  else at.strftime("%Y-%m-%dT%H"))
        key = (*(getattr(p, FIELD[g]) if g in groups else None for g in GROUPS), period)
        t = out.setdefault(key, dict.fromkeys(SUMS, 0))
        if p.status in ("pending", "invalid"):
            t["tokens_reserved"] += p.token_bound
            t["usd_reserved"] += p.usd_bound
        else:
            for f in ("tokens_committed", "usd_committed", "tokens_liability",
                      "usd_liability"):
                t[f] += getattr(p, f) or 0
        t["requests"] += p.status != "cancelled"
    return out


async def _permits(b: Backend) -> None:
    """Eight permits over two teams, users and keys: two left pending, one each
    complete, exact, uncertain, tokens-known-less uncertain, cancelled and invalid."""
    outcomes: list[Any] = [
        None, Outcome(kind=OutcomeKind.COMPLETE, usage=Usage(input=40, output=2)),
        exact(30, 700), Outcome(kind=OutcomeKind.UNCERTAIN, detail="cut"), None,
        Outcome(kind=OutcomeKind.CANCELLED, detail="never sent"),
        Outcome(kind=OutcomeKind.INVALID, detail="negative tokens"),
        Outcome(kind=OutcomeKind.COMPLETE, usage=Usage(input=10, output=9))]
    for n, what in enumerate(outcomes):
        p = await principal(b.keys, team=f"t{n % 2}", limits=LIMITS, user=f"u{n % 3}")
        [permit] = await b.gov.admit([request(p, tokens=100 + n, usd=1_000 + n,
                                              rid=f"r{n}")])
        assert isinstance(permit, Permit), permit
        if what is not None:
            await b.gov.settle(permit.id, settlement(permit.request, what))


async def test_the_store_adds_up_what_the_log_holds(backend: Backend) -> None:
    """For every non-empty grouping and each bucket, and with a team and a status
    filter, the store's sums equal the log's rows added up one by one."""
    b = backend
    await _permits(b)
    rows = await b.gov.request_log(LogFilter(), limit=None)
    assert {p.status for p in rows} == {"pending", "complete", "uncertain", "cancelled",
                                        "invalid"}
    team = rows[0].team_id
    filters = [(LogFilter(), rows), (LogFilter(team_id=team),
                                     [p for p in rows if p.team_id == team]),
               (LogFilter(status="pending"), [p for p in rows if p.status == "pending"])]
    for f, selected in filters:
        for size in range(1, len(GROUPS) + 1):
            for groups in itertools.combinations(GROUPS, size):
                for bucket in ("day", "hour", "none"):
                    summed = await b.gov.request_summary(f, groups=groups, bucket=bucket)
                    got = {(s.team_id, s.user, s.key_id, s.model, s.period): {
                        k: getattr(s, k) for k in SUMS} for s in summed}
                    assert got == oracle(selected, groups, bucket), (f, groups, bucket)
