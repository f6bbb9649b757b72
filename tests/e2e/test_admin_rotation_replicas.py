"""Rotating a key across three shared replicas, with real processes (issue 27).

Three ``mayu serve`` replicas of the shared profile on one migrated Postgres database
(the built-in mock models answer, so no upstream process). The key is used on every
replica first, so each one holds its Principal in its cache; then ten rotation requests
with one Idempotency-Key race over the three replicas. One rotation happens (one new
secret, revision 2); the new secret works on every replica at once and the old one on
every replica until its grace ends, then is a 401 everywhere, although each replica
still holds that secret's Principal in its 5 s cache. ~12 s (three starts, a 5 s grace).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e._procs import Proc, start_gateway

pytestmark = pytest.mark.e2e

WRITE = "rotation-e2e-admin-write-token"
BODY = {"model": "mock-gpt", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def _config(work: Path, replica: int) -> Path:
    path = work / f"gw{replica}.yaml"
    path.write_text(yaml.safe_dump({
        "data_dir": str(work / f"gw{replica}"), "demo": False,
        "server": {"replica_id": f"gw{replica}",
                   "rotation_secret_ref": "env:IPT_ROTATION_SECRET", "admin_tokens": [
            {"name": "terraform", "token_ref": "env:IPT_ADMIN_WRITE", "access": "write"}]},
        "key_store": {"type": "postgres"}, "governance_store": {"type": "postgres"},
        "database": {"dsn_ref": "env:INFERPLANE_DATABASE_URL", "pool_min_size": 1,
                     "pool_max_size": 4}}))
    return path


def _chat(gw: Proc, secret: str) -> int:
    return httpx.post(f"{gw.url}/v1/chat/completions", json=BODY, timeout=30,
                      headers={"Authorization": f"Bearer {secret}"}).status_code


def test_one_rotation_across_replicas_and_the_old_secret_ends_everywhere(
        tmp_path: Path, pg_dsn: str) -> None:
    env = {"INFERPLANE_DATABASE_URL": pg_dsn, "IPT_ADMIN_WRITE": WRITE,
           "IPT_ROTATION_SECRET": "rotation-e2e-derivation-secret-0123456789"}
    admin = {"Authorization": f"Bearer {WRITE}"}
    gateways: list[Proc] = []
    try:
        for i in range(3):
            gateways.append(start_gateway(_config(tmp_path, i), env=env))
        assert httpx.post(f"{gateways[0].url}/admin/v1/teams", json={"name": "t"},
                          headers=admin).status_code == 201
        made = httpx.post(f"{gateways[1].url}/admin/v1/keys", json={"team": "t"},
                          headers=admin).json()
        old, key_id = made["secret"], made["key"]["key_id"]
        assert [_chat(gw, old) for gw in gateways] == [200, 200, 200]

        def rotate(i: int) -> httpx.Response:
            return httpx.post(f"{gateways[i % 3].url}/admin/v1/keys/{key_id}/rotate",
                              json={"grace_seconds": 5}, timeout=30,
                              headers={**admin, "Idempotency-Key": "incident-42"})

        with ThreadPoolExecutor(max_workers=10) as pool:
            answers = list(pool.map(rotate, range(10)))
        assert {r.status_code for r in answers} == {200}, [r.text for r in answers]
        assert len({r.json()["secret"] for r in answers}) == 1
        assert [r.json()["replayed"] for r in answers].count(False) == 1
        new = answers[0].json()["secret"]
        until = datetime.fromisoformat(answers[0].json()["previous_valid_until"])
        record = httpx.get(f"{gateways[2].url}/admin/v1/keys/{key_id}", headers=admin).json()
        assert record["revision"] == 2

        assert [_chat(gw, new) for gw in gateways] == [200, 200, 200]
        assert datetime.now(UTC) < until  # a second or so into a 5 s grace
        # Each replica now caches the old secret's Principal (5 s), with its grace's end.
        assert [_chat(gw, old) for gw in gateways] == [200, 200, 200]
        while datetime.now(UTC) <= until:
            time.sleep(0.05)
        assert [_chat(gw, old) for gw in gateways] == [401, 401, 401]
        assert [_chat(gw, new) for gw in gateways] == [200, 200, 200]
    finally:
        for gw in gateways:
            gw.stop()
