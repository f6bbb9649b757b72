"""``GET /v1/me`` on a lease-profile plane shows the global budget (issue 25).

inferplaned, one plane (its own SQLite) and a mock upstream, real processes: after a
request, the plane's /v1/me lists the policy budget's account with the plane's own
figures and, under ``lease``, its allowance and the budget's global limit and remaining
as of its last heartbeat (with its age), which equal the ledger's account row.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e._lease import (
    LeaseStack,
    budget_doc,
    chat,
    lease_stack,
    race,
    wait_until,
)
from tests.e2e._procs import Proc, upstream_proc

pytestmark = pytest.mark.e2e

TEAM, UID, LIMIT_MILLI = "lease-team", "global/spend", 50
LIMIT_MILLI_SMALL = 20_000  # µUSD: 20 milliUSD


upstream = upstream_proc  # the fixtures, under this module's names
stack = lease_stack


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


def _account(url: str, key: str) -> dict[str, object]:
    me = httpx.get(f"{url}/v1/me", headers={"Authorization": f"Bearer {key}"},
                   timeout=10).json()
    entry: dict[str, object] = next(e for e in me["limits"] if e["kind"] == "account")
    return entry


def test_a_planes_remaining_is_what_its_next_admission_allows(
        stack: LeaseStack, upstream: Proc) -> None:
    """Another plane spends the budget down: this plane's /v1/me ``remaining`` for the
    account is what its next request may cost (its lease's headroom, or what the budget
    had left at the last heartbeat), not the global limit less its own spend. A request
    bounded one µUSD-step above it is a 402; one bounded within it is admitted."""
    stack.publish(budget_doc("global", "*", limit_milli=20, grant_milli=1))
    p1 = stack.add_plane("p1", teams=[TEAM], upstream=upstream)
    p2 = stack.add_plane("p2", teams=[TEAM], upstream=upstream)
    assert p1 is not None and p2 is not None
    k1, k2 = stack.keys[("p1", TEAM)], stack.keys[("p2", TEAM)]
    wait_until(lambda: chat(p1.url, k1, max_tokens=1).status_code == 200,
               what="a request admitted on p1")
    input_part = stack.largest_bound("p1") - 4  # the bound less 1 output token's price
    race([(p2.url, k2)], workers=2, max_tokens=200)  # p2's bound: about 800 µUSD

    # Both planes idle: each releases what it does not need; then nothing moves.
    readings: list[int] = []

    def settled() -> bool:
        entry = _account(p1.url, k1)
        readings.append(int(entry["remaining"]))  # type: ignore[call-overload]
        time.sleep(1.0)
        return len(readings) >= 3 and len(set(readings[-3:])) == 1

    wait_until(settled, what="p1's figures settled")
    entry = _account(p1.url, k1)
    remaining = int(entry["remaining"])  # type: ignore[call-overload]
    used = sum(int(entry[f]) for f in ("committed", "liability", "reserved"))  # type: ignore[call-overload]
    lease = entry["lease"]
    assert isinstance(lease, dict)
    assert remaining < LIMIT_MILLI_SMALL - used  # what it said before: limit less its own
    assert remaining == max(0, lease["allowance"] - used, lease["remaining"])
    over = remaining // 4 + 1  # output alone bounds it above ``remaining``
    refused = chat(p1.url, k1, max_tokens=over)
    assert refused.status_code == 402, refused.text
    # The input bound follows the body's bytes: a longer max_tokens adds a few.
    within = (remaining - input_part - 8) // 4
    assert within >= 1, (remaining, input_part)  # p2 left room for a small request
    admitted = chat(p1.url, k1, max_tokens=within)
    assert admitted.status_code == 200, (entry, admitted.text)
