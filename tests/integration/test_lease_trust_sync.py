"""What a data-plane token may do with ``POST /v1alpha1/sync`` (issue 25), against a real
migrated Postgres (Litestar test client): a token reports only for its own plane ids, a
plane id held by one token is refused to another, fresh counters (a new frame) are
refused while the plane is live and rate-limited after, committed never goes backwards
within a frame, every numeric field is bounded (400 with its path), and only real
windows of published rules for the plane's own teams get ledger rows, at most a cap."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from litestar.testing import AsyncTestClient

from controlplane import create_app
from controlplane.settings import (
    LeaseSettings,
)
from gateway.governance import CounterKey
from tests.integration._inferplaned import control_plane_config

pytestmark = pytest.mark.integration

WRITER = "w" * 8 + "-writer-token-1"
READER = "r" * 8 + "-reader-token-1"
NODE_A = "a" * 8 + "-node-a-token-1"
NODE_B = "b" * 8 + "-node-b-token-1"
ANY = "n" * 8 + "-unscoped-token"
LIMIT = 1_000_000  # µUSD: limitMilliUSD 1000
UID = "spend/daily"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def budget_doc() -> dict[str, Any]:
    return {"apiVersion": "inferplane.dev/v1alpha1", "kind": "GovernancePolicy",
            "metadata": {"name": "spend"},
            "spec": {"rules": [{"name": "daily", "failurePolicy": "FailClosed",
                                "subject": {"kind": "team", "team": "*"},
                                "budget": {"limitMilliUSD": LIMIT // 1000, "window": "day",
                                           "lease": {"grant": 20, "renewInterval": "2s"}}}]}}


def beat(*, plane: str = "node-a", frame: str = "frame-a", seq: int = 1,
         accounts: list[dict[str, Any]] | None = None,
         teams: tuple[str, ...] = ("alpha",)) -> dict[str, Any]:
    return {"dataplane": {"id": plane, "build": "test"}, "frame": frame, "boot": "boot-1",
            "seq": seq, "accounts": accounts or [], "teams": list(teams)}


def report(day: str, *, committed: int = 0, want: int = 0, team: str = "alpha",
           period: str | None = None) -> dict[str, Any]:
    key = CounterKey.account(UID, f"team={team}", "day", period or day).text
    return {"key": key, "rule_uid": UID, "committed": committed, "want": want}


@pytest.fixture
async def client(pg_dsn: str, monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[AsyncTestClient[Any]]:
    config = control_plane_config(
        monkeypatch, pg_dsn, writers={"ci": WRITER}, readers={"dash": READER},
        planes={"nodes-a": (NODE_A, {"planes": ["node-a"]}),
                "nodes-b": (NODE_B, {"planes": ["node-b", "pool-b-*"]}), "legacy": ANY},
        lease=LeaseSettings(frame_change_interval_s=600, max_accounts_per_plane=3))
    async with AsyncTestClient(app=create_app(config)) as c:
        r = await c.put("/v1alpha1/policies/spend", json=budget_doc(), headers=bearer(WRITER))
        assert r.status_code == 200, r.text
        yield c


async def post(client: AsyncTestClient[Any], token: str, body: dict[str, Any]
               ) -> tuple[int, dict[str, Any]]:
    r = await client.post("/v1alpha1/sync", json=body, headers=bearer(token))
    answer: dict[str, Any] = r.json()
    return r.status_code, answer


async def ok(client: AsyncTestClient[Any], token: str, body: dict[str, Any]
             ) -> dict[str, Any]:
    status, answer = await post(client, token, body)
    assert status == 200, answer
    return answer


def figures(dsn: str) -> list[tuple[Any, ...]]:
    """Every ledger figure: the account rows and the grant rows."""
    with psycopg.connect(dsn) as conn:
        accounts = conn.execute("SELECT key, committed, liability, reserved,"
                                " leased_outstanding FROM authority_accounts"
                                " ORDER BY key").fetchall()
        grants = conn.execute("SELECT account, dataplane, frame, committed, allowance,"
                              " prior_committed, prior_unobserved, adoptions"
                              " FROM lease_grants ORDER BY account, dataplane").fetchall()
    return [*accounts, *grants]


def silence(dsn: str, plane: str) -> None:
    """Make ``plane`` look silent for an hour (no longer live)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE lease_dataplanes SET last_heartbeat = last_heartbeat"
                     " - interval '1 hour' WHERE id = %s", (plane,))


async def test_a_second_token_claiming_a_plane_id_is_refused_and_the_victim_keeps_its_budget(
        client: AsyncTestClient[Any], pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """The takeover reproduction: nodes-b names itself node-a with a new frame and want =
    the limit (403, its token is bound to node-b); an unbound token does the same (409,
    node-a belongs to nodes-a); both are logged with the token names, nothing moves, and
    node-a's next heartbeat keeps its allowance with no adoption."""
    day = (await ok(client, NODE_A, beat()))["day"]
    first = await ok(client, NODE_A, beat(seq=2, accounts=[report(day, committed=5_000)]))
    (lease,) = first["leases"]
    before = figures(pg_dsn)
    attack = beat(frame="evil", seq=1, accounts=[report(day, want=LIMIT)])
    caplog.set_level(logging.WARNING, logger="inferplaned.leases")
    status, answer = await post(client, NODE_B, attack)
    assert status == 403 and "'nodes-b' may not report for data plane 'node-a'" in (
        answer["error"]["message"])
    status, answer = await post(client, ANY, attack)
    assert status == 409 and "belongs to token 'nodes-a'" in answer["error"]["message"]
    assert figures(pg_dsn) == before
    logged = caplog.text
    assert "'nodes-b'" in logged and "'node-a'" in logged
    assert "token 'legacy', holder token 'nodes-a'" in logged
    again = await ok(client, NODE_A, beat(seq=3, accounts=[report(day, committed=6_000)]))
    assert lease["allowance"] == 5_000 + 20_000
    assert again["leases"][0]["allowance"] == 6_000 + 20_000  # spent + one grant, as before
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT liability, committed FROM authority_accounts"
                           " WHERE key = %s", (lease["key"],)).fetchone()
        adoptions = conn.execute("SELECT adoptions FROM lease_grants WHERE dataplane ="
                                 " 'node-a'").fetchone()
    assert row == (0, 6_000) and adoptions == (0,)


async def test_a_token_reports_only_for_its_own_ids_and_prefixes(
        client: AsyncTestClient[Any]) -> None:
    """nodes-b may sync as node-b and as any pool-b-* id, never as pool-c-1; an unbound
    token may claim an id nobody holds yet."""
    await ok(client, NODE_B, beat(plane="node-b"))
    await ok(client, NODE_B, beat(plane="pool-b-7"))
    status, _ = await post(client, NODE_B, beat(plane="pool-c-1"))
    assert status == 403
    await ok(client, ANY, beat(plane="laptop-1"))


async def test_a_new_frame_for_a_live_plane_is_refused_and_frame_changes_are_rate_limited(
        client: AsyncTestClient[Any], pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """Fresh counters while the plane is live: 409 (with the policy pull, no leases).
    Once it is silent: adopted, logged as
    an alarm, counted (metric and GET /v1alpha1/dataplanes). Another new frame within
    lease.frame_change_interval_s: 409 with Retry-After, even from a silent plane."""
    day = (await ok(client, NODE_A, beat()))["day"]
    await ok(client, NODE_A, beat(seq=2, accounts=[report(day, committed=100)]))
    status, answer = await post(client, NODE_A, beat(frame="frame-2"))
    assert status == 409 and "is live in another counter store" in answer["error"]["message"]
    # The policy pull still comes (no leases): a plane whose new frame waits is governed.
    pull = answer["answer"]
    assert set(pull["documents"]) == {"spend"} and pull["leases"] == []
    assert pull["applied"] is False
    silence(pg_dsn, "node-a")
    caplog.set_level(logging.WARNING, logger="inferplaned.leases")
    await ok(client, NODE_A, beat(frame="frame-2", accounts=[report(day, committed=0)]))
    assert "ALARM lease frame change: data plane 'node-a' (token 'nodes-a')" in caplog.text
    silence(pg_dsn, "node-a")
    r = await client.post("/v1alpha1/sync", json=beat(frame="frame-3"), headers=bearer(NODE_A))
    assert r.status_code == 409 and r.headers["retry-after"] == "600"
    assert "lease.frame_change_interval_s" in r.json()["error"]["message"]
    (plane,) = (await client.get("/v1alpha1/dataplanes", headers=bearer(READER))
                ).json()["dataplanes"]
    assert plane["frame"] == "frame-2" and plane["frame_changes"] == 1
    text = (await client.get("/metrics", headers=bearer(READER))).text
    assert "inferplaned_lease_frame_changes_total 1.0" in text
    assert 'inferplaned_lease_sync_refusals_total{reason="frame_live"} 1.0' in text
    assert 'inferplaned_lease_sync_refusals_total{reason="frame_rate"} 1.0' in text
    assert (await client.get("/metrics", headers=bearer(NODE_A))).status_code == 403


async def test_committed_going_backwards_within_a_frame_is_refused_not_adopted(
        client: AsyncTestClient[Any], pg_dsn: str) -> None:
    """The 10, 0, 10, 0 … reporter (want = the limit): each lower figure is ignored with
    its reason and no lease; nothing is adopted, nothing becomes liability."""
    day = (await ok(client, NODE_A, beat()))["day"]
    seq = 2
    for committed in (10, 0, 10, 0, 10, 0):
        answer = await ok(client, NODE_A, beat(seq=seq, accounts=[
            report(day, committed=committed, want=LIMIT)]))
        seq += 1
        if committed == 0:
            assert answer["leases"] == []
            (ignored,) = answer["ignored"]
            assert "committed 0 is below 10" in ignored["reason"]
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT a.liability, g.adoptions, g.prior_unobserved"
                           " FROM authority_accounts a JOIN lease_grants g"
                           " ON g.account = a.key").fetchone()
    assert row == (0, 0, 0)
    text = (await client.get("/metrics", headers=bearer(READER))).text
    assert 'inferplaned_lease_account_refusals_total{reason="went_backwards"} 3.0' in text


@pytest.mark.parametrize(("field", "value", "path"), [
    ("seq", 2**63, "$.seq"),
    ("seq", 2**53, "$.seq"),
    ("applied_generation", 2**63, "$.applied_generation"),
    ("committed", 2**62, "$.accounts[0].committed"),
    ("want", 2**60, "$.accounts[0].want"),
    ("id", "node\nforged", "$.dataplane.id"),
])
async def test_every_numeric_field_is_bounded_with_its_path(
        client: AsyncTestClient[Any], field: str, value: Any, path: str) -> None:
    """An out-of-range figure (or a control character in an id) is a 400 naming the
    field's path, never a 500."""
    body = beat(accounts=[report("2026-01-01")])
    if field in ("committed", "want"):
        body["accounts"][0][field] = value
    elif field == "id":
        body["dataplane"]["id"] = value
    else:
        body[field] = value
    status, answer = await post(client, NODE_A, body)
    assert status == 400, answer
    assert path in answer["error"]["message"]


async def test_only_open_windows_of_published_rules_for_the_planes_teams_get_rows(
        client: AsyncTestClient[Any], pg_dsn: str) -> None:
    """An impossible date, a far period, a team not in the heartbeat's teams, a rule that
    is not published: each is ignored with its reason and gets no row; the plane's own
    team in today's window is leased."""
    day = (await ok(client, NODE_A, beat()))["day"]
    bad_date = report(day)
    bad_date["key"] = f"account:{UID}:team=alpha:day:2026-13-45"
    gone = {"key": CounterKey.account("gone/rule", "team=alpha", "day", day).text,
            "rule_uid": "gone/rule", "committed": 5}
    answer = await ok(client, NODE_A, beat(seq=2, accounts=[
        bad_date, report(day, period="9999-12-31"), report(day, team="zeta"), gone,
        report(day)]))
    assert [x["key"] for x in answer["leases"]] == [report(day)["key"]]
    reasons = sorted(x["reason"] for x in answer["ignored"])
    assert len(reasons) == 4
    assert any("'2026-13-45' is not an open window" in r for r in reasons)
    assert any("'9999-12-31' is not an open window" in r for r in reasons)
    assert any("team 'zeta' is not one of this plane's key store" in r for r in reasons)
    assert any("no lease-managed budget rule" in r for r in reasons)
    with psycopg.connect(pg_dsn) as conn:
        keys = [k for (k,) in conn.execute("SELECT key FROM authority_accounts")]
    assert keys == [report(day)["key"]]


async def test_a_plane_opens_at_most_its_cap_of_accounts(
        client: AsyncTestClient[Any]) -> None:
    """With lease.max_accounts_per_plane 3, a fourth new account is refused; the three
    the plane holds keep renewing."""
    day = (await ok(client, NODE_A, beat()))["day"]
    teams = ("t1", "t2", "t3", "t4")
    accounts = [report(day, team=t) for t in teams]
    answer = await ok(client, NODE_A, beat(seq=2, accounts=accounts, teams=teams))
    assert len(answer["leases"]) == 3
    (ignored,) = answer["ignored"]
    assert ignored["key"] == accounts[3]["key"]
    assert "already holds 3 ledger rows" in ignored["reason"]
    again = await ok(client, NODE_A, beat(seq=3, accounts=accounts[:3], teams=teams))
    assert len(again["leases"]) == 3 and again["ignored"] == []
