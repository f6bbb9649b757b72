"""``mayu_reserved_outstanding_micro_usd`` after a restart that resolves the journal
(issue 25): never negative, 0 with nothing in flight.

The previous run is played by hand on the real files (it admitted a permit in the local
store and journalled its dispatch, then died without settling); the restart is the real
app factory on the same data dir, whose Governor resolves that permit at start-up through
the same settlement hook as every other. The gauge counts this process's own permits: one
the previous run admitted was never added to it, so settling it takes nothing off.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.config import Settings, load_settings
from gateway.governance import Journal, LocalGovernanceStore, Permit
from gateway.keys import SqliteKeyStore
from gateway.replicas import journal_path
from tests.integration._pg_helpers import principal, request

pytestmark = pytest.mark.integration

BOUND = 24_684  # µUSD: the figure
BODY = {"model": "mock-gpt", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def outstanding(text: str) -> float:
    [value] = [s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "mayu_reserved_outstanding_micro_usd"]
    return value


async def _previous_run_dies_mid_request(settings: Settings) -> tuple[str, str]:
    """A permit admitted and dispatched, never settled: (its id, a key of its team)."""
    db = str(Path(settings.data_dir) / "mayu.db")
    keys, gov = SqliteKeyStore(db), LocalGovernanceStore(db)
    await keys.open()
    await gov.open()
    try:
        p = await principal(keys, team="t")
        [permit] = await gov.admit([request(p, usd=BOUND, rid="crashed")])
        assert isinstance(permit, Permit), permit
        journal = Journal(journal_path(settings))
        assert journal.open() == {}
        journal.admitted(permit)
        await journal.dispatching(permit.id)
        await journal.close()
        key, _ = await keys.create_key(team="t")
        return permit.id, key
    finally:
        await gov.close()
        await keys.close()


async def test_outstanding_reads_zero_after_the_journal_is_resolved(tmp_path: Path) -> None:
    """After a restart resolves a permit the previous run left open (bound 24,684 µUSD),
    the gauge reads 0, not -24,684; once a request of this run settles it reads 0 again."""
    settings = msgspec.structs.replace(load_settings(None), data_dir=str(tmp_path),
                                       demo=False)  # the built-in local profile and mock
    permit_id, key = await _previous_run_dies_mid_request(settings)
    app = create_app(settings)
    async with AsyncTestClient(app=app) as client:
        gw = app.state.gateway
        info = await gw.governance.permit_info(permit_id)
        assert info is not None and info.status == "uncertain"  # resolved at start-up
        assert outstanding((await client.get("/metrics")).text) == 0
        ok = await client.post("/v1/chat/completions", json=BODY,
                               headers={"Authorization": f"Bearer {key}"})
        assert ok.status_code == 200, ok.text
        assert await gw.governor.caught_up()
        assert outstanding((await client.get("/metrics")).text) == 0
