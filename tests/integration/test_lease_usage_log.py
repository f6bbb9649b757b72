"""A lease plane's usage records: the spool that queues them (real SQLite) and the request
log inferplaned stores them in (real Postgres).

The end-to-end path (three planes, inferplaned killed for a minute) is
``tests/e2e/test_lease_usage_spool.py``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from litestar.testing import AsyncTestClient
from prometheus_client import CollectorRegistry

from controlplane import create_app as create_control_plane
from controlplane.auth import Identity
from controlplane.usage import PlaneNotSynced, PlaneOfAnotherToken, UsageLog
from gateway.app import create_app
from gateway.db import Pool
from gateway.governance import LocalGovernanceStore
from gateway.lease import LeaseFile, UsageBatch, UsageRecord, UsageSpool
from tests.integration._admin import READ, bearer, gateway_settings
from tests.integration._console import sign_in
from tests.integration._inferplaned import control_plane_config

pytestmark = pytest.mark.integration

NODE = Identity("node-a", "dataplane", ("p1",), ("ml", "ops"))


def record(*, team: str = "ml", usd: int = 1_234, **extra: Any) -> UsageRecord:
    fields: dict[str, Any] = {
        "id": uuid.uuid4().hex, "request_id": f"req-{uuid.uuid4().hex[:8]}",
        "key_id": "k1", "team": team, "model": "gpt-lease", "status": "complete",
        "generation": 3, "day": "2026-12-07", "month": "2026-12", "token_bound": 300,
        "usd_bound": 9_000, "created_us": 1_796_600_000_000_000,
        "settled_us": 1_796_600_000_500_000, "tokens_committed": 120,
        "usd_committed": usd, "route": "/v1/chat/completions", "deployment": "up/mock",
        "client": "httpx", "http_status": 200, "input": 20, "output": 100}
    return UsageRecord(**(fields | extra))


async def synced(pool: Pool, plane: str, token: str) -> None:
    async with pool.connection() as conn:
        await conn.execute("INSERT INTO lease_dataplanes (id, token_name, frame, boot, seq)"
                           " VALUES (%s, %s, 'f', 'b', 1)", (plane, token))


def log_rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT replace(p.id::text, '-', ''), p.plane, p.team_id, p.usd_committed,"
            " p.tokens_committed, f.input, f.output, f.deployment FROM permits p"
            " LEFT JOIN permit_facts f ON f.permit_id = p.id ORDER BY 1").fetchall()


async def test_a_batch_sent_twice_is_stored_once(pg_pool: Pool, pg_dsn: str) -> None:
    """A replayed batch stores nothing twice: the second answer lists every id as
    present, and the log holds each record once with its figures and facts."""
    await synced(pg_pool, "p1", "node-a")
    log = UsageLog(pool=pg_pool, registry=CollectorRegistry())
    batch = UsageBatch(plane="p1", records=[record(usd=100 + i) for i in range(5)])
    first = await log.store(batch, NODE)
    again = await log.store(batch, NODE)
    ids = sorted(r.id for r in batch.records)
    assert sorted(first.stored) == ids and first.present == [] and first.conflicts == []
    assert again.stored == [] and sorted(again.present) == ids
    rows = log_rows(pg_dsn)
    assert [r[0] for r in rows] == ids
    by_id = {r.id: r for r in batch.records}
    for permit, plane, team, usd, tokens, inp, out, deployment in rows:
        assert (plane, team, usd, tokens) == ("p1", "ml", by_id[permit].usd_committed, 120)
        assert (inp, out, deployment) == (20, 100, "up/mock")


async def test_an_id_of_another_plane_is_a_conflict_left_alone(pg_pool: Pool,
                                                              pg_dsn: str) -> None:
    """The same permit id from another plane is answered as a conflict and never
    overwrites the first plane's record."""
    await synced(pg_pool, "p1", "node-a")
    await synced(pg_pool, "p2", "node-b")
    log = UsageLog(pool=pg_pool, registry=CollectorRegistry())
    shared = record(usd=7)
    await log.store(UsageBatch(plane="p1", records=[shared]), NODE)
    other = Identity("node-b", "dataplane", ("p2",), None)
    ack = await log.store(UsageBatch(plane="p2", records=[
        UsageRecord(**{**{f: getattr(shared, f) for f in shared.__struct_fields__},
                       "usd_committed": 999})]), other)
    assert ack.conflicts == [shared.id] and ack.stored == []
    assert [(r[1], r[3]) for r in log_rows(pg_dsn)] == [("p1", 7)]


async def test_a_team_the_token_may_not_report_is_refused(pg_pool: Pool,
                                                          pg_dsn: str) -> None:
    """Records of a team outside the token's ``teams`` are refused and never stored;
    the others of the batch are."""
    await synced(pg_pool, "p1", "node-a")
    log = UsageLog(pool=pg_pool, registry=CollectorRegistry())
    good, bad = record(team="ops"), record(team="finance")
    ack = await log.store(UsageBatch(plane="p1", records=[good, bad]), NODE)
    assert ack.stored == [good.id] and ack.refused == [bad.id]
    assert [r[0] for r in log_rows(pg_dsn)] == [good.id]


async def test_a_plane_stores_only_after_its_token_synced_it(pg_pool: Pool,
                                                             pg_dsn: str) -> None:
    """A plane that never synced is told to sync first (409), and a plane bound to
    another token is refused (409); neither stores anything."""
    log = UsageLog(pool=pg_pool, registry=CollectorRegistry())
    with pytest.raises(PlaneNotSynced):
        await log.store(UsageBatch(plane="p1", records=[record()]), NODE)
    await synced(pg_pool, "p1", "node-z")
    with pytest.raises(PlaneOfAnotherToken):
        await log.store(UsageBatch(plane="p1", records=[record()]), NODE)
    assert log_rows(pg_dsn) == []


async def until(check: Callable[[], bool], *, what: str, deadline_s: float = 60.0) -> None:
    """Poll ``check`` (a hang guard, not a timing assertion: the shipper's backoff is at
    most 10 s)."""
    end = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < end, f"never happened within {deadline_s}s: {what}"
        await asyncio.sleep(0.05)


def settle_rows(path: Path, count: int) -> list[str]:
    """``count`` permits and their settlements written as the local store writes them."""
    ids = [uuid.uuid4().hex for _ in range(count)]
    with sqlite3.connect(path) as conn:
        for i, permit in enumerate(ids):
            conn.execute(
                "INSERT INTO gov_permits (id, request_id, key_id, team_id, user, model, day,"
                " month, token_bound, usd_bound, request, status, created_us) VALUES"
                " (?, ?, 'k1', 't1', NULL, 'm', '2026-12-07', '2026-12', 10, 100, ?,"
                " 'settled', ?)", (permit, f"r{i}", b'{"policy_generation": 4}', i))
            conn.execute(
                "INSERT INTO gov_settlements (permit_id, kind, fingerprint, tokens_committed,"
                " usd_committed, settled_us) VALUES (?, 'complete', 'fp', 5, 50, ?)",
                (permit, i))
    return ids


async def test_the_spool_queues_each_settlement_up_to_its_bound(tmp_path: Path) -> None:
    """Each settlement queues its permit in its own transaction; past the bound the
    settlement still commits and is counted as dropped; the state survives a reopen."""
    path = tmp_path / "mayu.db"
    store = LocalGovernanceStore(str(path))
    await store.open()
    spool = UsageSpool(str(path), url="http://127.0.0.1:9", token=None, bound=3)
    await spool.open()
    try:
        ids = settle_rows(path, 5)
        with sqlite3.connect(path) as conn:
            queued = [r[0] for r in conn.execute(
                "SELECT permit_id FROM usage_spool ORDER BY seq")]
            settled = conn.execute("SELECT count(*) FROM gov_settlements").fetchone()[0]
        assert queued == ids[:3] and settled == 5
    finally:
        await spool.close()
    again = UsageSpool(str(path), url="http://127.0.0.1:9", token=None, bound=3)
    await again.open()
    try:
        assert (again.state.queued, again.state.dropped, again.state.bound) == (3, 2, 3)
    finally:
        await again.close()
        await store.close()


@pytest.fixture
async def shared_gateway(request: pytest.FixtureRequest, tmp_path: Path,
                         monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[AsyncTestClient[Any]]:
    """A shared-profile gateway on the test's database (the one inferplaned writes)."""
    settings = gateway_settings(request, tmp_path, monkeypatch, profile="shared")
    async with AsyncTestClient(app=create_app(settings)) as client:
        client.follow_redirects = False  # the console's sign-in looks at its redirect
        yield client


async def test_the_shared_request_log_lists_every_plane_with_a_filter(
        pg_pool: Pool, shared_gateway: AsyncTestClient[Any]) -> None:
    """The admin API's request log on the shared database lists the planes' records with
    their plane, ``plane=`` keeps one plane's (list, summary, CSV), one opens as any
    request, and the console's log names the plane."""
    for plane, token in (("p1", "node-a"), ("p2", "node-b")):
        await synced(pg_pool, plane, token)
    log = UsageLog(pool=pg_pool, registry=CollectorRegistry())
    p1 = [record(usd=100), record(usd=250, team="ops")]
    await log.store(UsageBatch(plane="p1", records=p1), NODE)
    await log.store(UsageBatch(plane="p2", records=[record(usd=7)]),
                    Identity("node-b", "dataplane", None, None))
    c, read = shared_gateway, bearer(READ)
    every = (await c.get("/admin/v1/requests", headers=read)).json()["data"]
    assert sorted(r["plane"] for r in every) == ["p1", "p1", "p2"]
    one = (await c.get("/admin/v1/requests", params={"plane": "p1"}, headers=read)).json()
    assert sorted(r["request_id"] for r in one["data"]) == sorted(r.request_id for r in p1)
    assert all(r["plane"] == "p1" and r["deployment"] == "up/mock" for r in one["data"])
    summary = (await c.get("/admin/v1/requests/summary", headers=read, params={
        "plane": "p1", "group_by": "team", "bucket": "none"})).json()["data"]
    assert {s["team_id"]: s["usd_committed"] for s in summary} == {"ml": 100, "ops": 250}
    csv_text = (await c.get("/admin/v1/requests.csv", params={"plane": "p2"},
                            headers=read)).text
    assert len(csv_text.strip().splitlines()) == 2 and ",p2" in csv_text
    detail = await c.get(f"/admin/v1/requests/{one['data'][0]['permit_id']}", headers=read)
    assert detail.status_code == 200 and detail.json()["request"]["plane"] == "p1"
    assert (await c.get("/admin/v1/requests", params={"plane": "p9"},
                        headers=read)).json()["data"] == []
    await sign_in(c, READ)
    page = await c.get("/console/requests", params={"plane": "p2"})
    assert page.status_code == 200 and page.text.count('data-plane="p2"') == 1


async def test_the_shipper_deletes_what_inferplaned_answered_and_counts_the_refused(
        tmp_path: Path, pg_dsn: str, pg_pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plane's spool shipping to the real inferplaned app: before its plane synced, a
    batch is refused (409) and nothing leaves the queue; once synced, the stored record
    leaves it, a team its token may not report and an id another plane holds leave it
    counted as dropped, and inferplaned's log holds only the stored one."""
    config = control_plane_config(monkeypatch, pg_dsn, writers={"ci": "w" * 24}, planes={
        "node-a": ("d" * 24, {"planes": ["p1"], "teams": ["ml"]})})
    app = create_control_plane(config)
    path = tmp_path / "mayu.db"
    store, lease_file = LocalGovernanceStore(str(path)), LeaseFile(str(path))
    await store.open()
    await lease_file.open(dataplane_id="p1", default_id="p1")
    spool = UsageSpool(str(path), url="http://inferplaned", token="d" * 24,
                       # Litestar's ASGI types are narrower than httpx's protocol
                       transport=httpx.ASGITransport(app=app))  # type: ignore[arg-type]
    await spool.open()
    try:
        ok, other_team, taken = settle_rows(path, 3)
        with sqlite3.connect(path) as conn:  # team ids stand for names (no key store)
            conn.execute("UPDATE gov_permits SET team_id = 'ml'")
            conn.execute("UPDATE gov_permits SET team_id = 'finance' WHERE id = ?",
                         (other_team,))
        async with AsyncTestClient(app=app):  # its lifespan: the pool
            await spool.start()  # the shipper, in the background
            await until(lambda: spool.failures >= 1, what="a batch refused")
            assert (spool.state.queued, spool.shipped) == (3, 0)
            await synced(pg_pool, "p1", "node-a")
            await synced(pg_pool, "p2", "node-b")
            await UsageLog(pool=pg_pool, registry=CollectorRegistry()).store(
                UsageBatch(plane="p2", records=[record(id=taken)]),
                Identity("node-b", "dataplane", None, None))
            await until(lambda: spool.state.queued == 0, what="the queue emptied")
        assert (spool.state.dropped, spool.shipped) == (2, 1)
        assert [(r[0], r[1]) for r in log_rows(pg_dsn)] == sorted(
            [(ok, "p1"), (taken, "p2")])
    finally:
        await spool.close()
        await lease_file.close()
        await store.close()
