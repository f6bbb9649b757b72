"""Request-log retention in every governance store (local, lease plane, Postgres,
Postgres merged) and ``mayu permits prune``: only settled permits of ended months past
the retention go, with their segments and facts; a pending permit and every permit of
the current month stay, and so do the counters' figures."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import yaml

from gateway.governance import LogFilter, Permit, RequestFacts
from gateway.governance._retention import cutoff, prune
from gateway.keys import TeamLimits
from tests.conftest import ROOT
from tests.integration._pg_helpers import principal, request
from tests.integration.test_inflight import Stores, stores  # noqa: F401 (a fixture)
from tests.settling import exact, settlement

NOW = datetime.now(UTC)
OLD = datetime(2026, 10, 15, 12, tzinfo=UTC)  # a month that has ended


async def _admit(s: Stores, rid: str, at: datetime) -> Permit:
    p = await principal(s.keys, team="t1", limits=TeamLimits(usd_micros_per_day=10**9))
    [decided] = await s.gov.admit([request(p, rid=rid, now=at)])
    assert isinstance(decided, Permit)
    return decided


async def test_only_settled_permits_of_ended_months_are_pruned(stores: Stores) -> None:  # noqa: F811
    s = stores
    old, current, pending = (await _admit(s, "old", OLD), await _admit(s, "cur", NOW),
                             await _admit(s, "pending", OLD))
    for p in (old, current):
        done = msgspec.structs.replace(settlement(p.request, exact(10, 100)),
                                       facts=RequestFacts(route="/v1/messages", client="codex"))
        await s.gov.settle(p.id, done)
    [day_counter] = [c.counter for c in current.request.charges if ":usd:day:" in c.counter]
    before_figures = await s.held(day_counter)

    # Everything admitted up to a day from now is old enough; only ended months go.
    gone = await s.gov.prune_permits(before=NOW + timedelta(days=1),
                                     month=cutoff(1, NOW)[1], limit=100)
    assert gone == 1
    log = {p.request_id for p in await s.gov.request_log(LogFilter(), limit=None)}
    assert log == {"cur", "pending"}
    assert await s.gov.get_permit(old.id) is None  # its segments went with it
    assert await s.gov.get_permit(pending.id) is not None
    assert (await s.gov.permit_info(current.id)).client == "codex"  # its facts stayed
    assert await s.held(day_counter) == before_figures  # the counters are untouched
    # With a real retention nothing admitted today is old enough.
    assert await prune(s.gov, 1) == 0
    assert await s.gov.prune_permits(before=NOW + timedelta(days=1),
                                     month=cutoff(1, NOW)[1], limit=100) == 0


def test_mayu_permits_prune_reports_what_it_deleted(tmp_path: Path) -> None:
    config = tmp_path / "mayu.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path),
                                      "governance_store": {"retention_days": 30}}))
    subprocess.run([sys.executable, "-m", "gateway", "keys", "list", "--config",
                    str(config)], check=True, capture_output=True, cwd=ROOT)
    done = subprocess.run([sys.executable, "-m", "gateway", "permits", "prune", "--config",
                           str(config), "--json"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["pruned"] == 0 and report["months_before"] == NOW.strftime("%Y-%m")
    bad = subprocess.run([sys.executable, "-m", "gateway", "permits", "prune",
                          "--older-than-days", "0"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--older-than-days" in bad.stderr
