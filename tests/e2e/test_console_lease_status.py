"""Operations on a lease-profile plane: the plane reports itself (issue 28).

inferplaned, one plane (its own SQLite) and a mock upstream, real processes: after a
request on a policy budget, the plane's ``GET /admin/v1/status`` names the lease
profile and lists this plane with its version, the age of its last answered heartbeat
and its lease on the budget (the same allowance ``/v1/me`` shows), and says that the
other planes are inferplaned's to list; the console's Operations page shows the same.
"""

from __future__ import annotations

import re

import httpx
import pytest

from gateway import __version__
from tests.e2e._lease import (
    ADMIN_TOKEN,
    LeaseStack,
    budget_doc,
    chat,
    lease_stack,
    wait_until,
)
from tests.e2e._procs import Proc, upstream_proc

pytestmark = pytest.mark.e2e

TEAM, UID = "lease-team", "global/spend"


upstream = upstream_proc  # the fixtures, under this module's names
stack = lease_stack


def test_a_plane_reports_its_heartbeat_and_leases(stack: LeaseStack, upstream: Proc) -> None:
    """Status: lease profile, this plane (id, version, a recent heartbeat, its lease on
    the budget equal to /v1/me's allowance), no schema revision, the note naming
    inferplaned's route; the Operations page draws the plane and the note."""
    stack.publish(budget_doc("global", "*", limit_milli=50, grant_milli=5))
    plane = stack.add_plane("p1", teams=[TEAM], upstream=upstream)
    assert plane is not None
    key = stack.keys[("p1", TEAM)]
    wait_until(lambda: chat(plane.url, key).status_code == 200, what="a request admitted")
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    status = httpx.get(f"{plane.url}/admin/v1/status", headers=admin, timeout=10).json()
    assert (status["profile"], status["schema_revision"]) == ("lease", None)
    assert "GET /v1alpha1/dataplanes" in status["note"]
    [me] = status["data_planes"]
    assert (me["id"], me["version"]) == ("p1", __version__)
    assert me["last_heartbeat_age_s"] is not None and 0 <= me["last_heartbeat_age_s"] < 60
    [lease] = [x for x in me["leases"] if x["rule_uid"] == UID]
    mine = httpx.get(f"{plane.url}/v1/me", headers={"Authorization": f"Bearer {key}"},
                     timeout=10).json()
    account = next(e for e in mine["limits"] if e["kind"] == "account")
    assert lease["allowance"] == account["lease"]["allowance"] > 0
    assert lease["limit"] == 50_000

    with httpx.Client(base_url=plane.url, timeout=10) as browser:
        form = browser.get("/console/login")
        token = re.search(r'name="login_csrf" value="([^"]+)"', form.text)
        assert token
        r = browser.post("/console/login", data={"credential": ADMIN_TOKEN,
                                                 "login_csrf": token.group(1)})
        assert r.status_code == 303, r.text
        page = browser.get("/console/operations")
    assert page.status_code == 200, page.text
    assert '<dl class="figures" data-plane="p1">' in page.text
    assert f"<td>{lease['account']}</td>" in page.text
    assert "which a data plane&#39;s token may not read" in page.text
