"""A lease plane asks only for the teams its key store has (issue 25, item 2): a rule
naming a team the plane does not have parks none of that team's budget here, a team
created later is leased through the missing-lease path, the heartbeat carries the teams,
and routine heartbeats log at DEBUG."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.governance import CounterKey, utc_windows
from gateway.keys import Team
from gateway.lease import LeaseClient, LeaseState, apply_documents
from gateway.lease._client import _QuietSync


class _Keys:
    def __init__(self, *names: str) -> None:
        self.names = list(names)
        self.reads = 0

    async def list_teams(self) -> list[Team]:
        self.reads += 1
        return [Team(id=f"id-{n}", name=n) for n in self.names]


class _File:
    async def figures(self, periods: Any) -> dict[str, Any]:
        return {}


def _rule(name: str, team: str) -> dict[str, Any]:
    return {"name": name, "failurePolicy": "FailClosed", "subject": {"kind": "team",
                                                                     "team": team},
            "budget": {"limitMilliUSD": 1000, "window": "day"}}


def _client(keys: _Keys) -> LeaseClient:
    state = LeaseState()
    doc = {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
           "metadata": {"name": "p"},
           "spec": {"rules": [_rule("x-only", "x"), _rule("every", "*")]}}
    state.applied = apply_documents({"p": doc}, namespace="n", generation=1, fingerprint="f")
    return LeaseClient(url="http://cp", token=None, dataplane_id="node-a", default_id="h",
                       state=state, lease_file=_File(), key_store=keys)  # type: ignore[arg-type]


def _account(uid: str, team: str) -> str:
    day, _ = utc_windows(datetime.now(UTC))
    return CounterKey.account(uid, f"team={team}", "day", day).text


async def test_a_plane_leases_only_the_teams_of_its_key_store() -> None:
    """Team x's rule is named by the policy, but the plane has only team alpha: the
    heartbeat reports alpha's accounts and carries teams = [alpha], nothing of x."""
    client = _client(_Keys("alpha"))
    accounts, teams = await client._accounts()
    assert teams == ["alpha"]
    assert [a.key for a in accounts] == [_account("p/every", "alpha")]


async def test_a_team_created_later_is_leased_through_the_missing_lease_path() -> None:
    """A request of team beta (created after the team list was read) asks for its lease;
    that heartbeat re-reads the key store and reports beta, within one round trip."""
    keys = _Keys("alpha")
    client = _client(keys)
    await client._accounts()
    keys.names.append("beta")
    client.state.demand[_account("p/every", "beta")] = ("p/every", 500)
    client._teams = (client._teams[0] - 2.0, client._teams[1])  # older than the re-read
    accounts, teams = await client._accounts()
    assert teams == ["alpha", "beta"]
    beta = [a for a in accounts if a.key == _account("p/every", "beta")]
    assert beta and beta[0].want == 500
    assert keys.reads == 2


def test_routine_heartbeats_log_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    """httpx's INFO request line for the sync URL is demoted to DEBUG (dropped at INFO);
    other request lines stay at INFO."""
    httpx_log = logging.getLogger("httpx")
    quiet = _QuietSync("http://cp/v1alpha1/sync")
    httpx_log.addFilter(quiet)
    try:
        caplog.set_level(logging.INFO, logger="httpx")
        httpx_log.info('HTTP Request: POST http://cp/v1alpha1/sync "HTTP/1.1 200 OK"')
        httpx_log.info('HTTP Request: POST http://other/x "HTTP/1.1 200 OK"')
    finally:
        httpx_log.removeFilter(quiet)
    assert [r.getMessage() for r in caplog.records] == [
        'HTTP Request: POST http://other/x "HTTP/1.1 200 OK"']


async def test_a_credential_of_a_team_created_just_after_a_read_gets_it_read_again() -> None:
    """A credential names a key the plane does not hold (its team was created on the plane
    a moment ago, within the 1 s re-read throttle of the last read): the heartbeat that
    request asked for lists the teams as read after the ask, so the team's keys come
    with its answer (the race tests/e2e/test_identity_lease.py hit when the CLI was fast)."""
    keys = _Keys("alpha")
    client = _client(keys)
    client._key_asked = 0.0  # an earlier credential's ask: a fresh read
    _, teams = await client._accounts()
    assert teams == ["alpha"] and keys.reads == 1
    keys.names.append("ml")  # created now, well within _TEAMS_FRESH_S of that read
    client._key_asked = time.monotonic()  # what await_brokered_key records as it asks
    _, teams = await client._accounts()
    assert teams == ["alpha", "ml"] and keys.reads == 2
    _, teams = await client._accounts()  # no new ask: the throttled list stands
    assert keys.reads == 2
