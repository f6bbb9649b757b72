"""``GET /v1/me`` on a lease-profile plane shows the global budget (issue 25).

inferplaned, one plane (its own SQLite) and a mock upstream, real processes: after a
request, the plane's /v1/me lists the policy budget's account with the plane's own
figures and, under ``lease``, its allowance and the budget's global limit and remaining
as of its last heartbeat (with its age), which equal the ledger's account row.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e._lease import LeaseStack, budget_doc, chat, running_stack, wait_until
from tests.e2e._procs import Proc, start_mock_upstream

pytestmark = pytest.mark.e2e

TEAM, UID, LIMIT_MILLI = "lease-team", "global/spend", 50


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[Proc]:
    proc = start_mock_upstream(tmp_path)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def stack(tmp_path: Path, pg_dsn: str) -> Iterator[LeaseStack]:
    with running_stack(tmp_path, pg_dsn) as s:
        yield s


def test_a_plane_shows_its_lease_and_the_global_remaining_budget(
        stack: LeaseStack, upstream: Proc) -> None:
    stack.publish(budget_doc("global", "*", limit_milli=LIMIT_MILLI, grant_milli=5))
    plane = stack.add_plane("p1", teams=[TEAM], upstream=upstream)
    assert plane is not None
    key = stack.keys[("p1", TEAM)]
    wait_until(lambda: chat(plane.url, key).status_code == 200, what="a request admitted")

    def account() -> dict[str, object] | None:
        me = httpx.get(f"{plane.url}/v1/me", headers={"Authorization": f"Bearer {key}"},
                       timeout=10).json()
        return next((e for e in me["limits"] if e["kind"] == "account"), None)

    entry = account()
    assert entry is not None and entry["rule"] == UID and entry["limit"] == LIMIT_MILLI * 1000
    assert entry["committed"] > 0
    lease = entry["lease"]
    assert isinstance(lease, dict)
    assert lease["limit"] == LIMIT_MILLI * 1000 and lease["allowance"] > 0
    assert 0 <= lease["age_s"] < 60
    row = stack.account(UID)
    spent_everywhere = row["committed"] + row["liability"] + row["leased"]
    # The remaining the heartbeat carried is what the ledger had left after its grant;
    # later heartbeats only lower it as this plane spends (nobody else does here).
    assert lease["remaining"] >= LIMIT_MILLI * 1000 - spent_everywhere - lease["allowance"]
    assert lease["remaining"] <= LIMIT_MILLI * 1000 - entry["committed"]
