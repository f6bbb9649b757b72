"""A governance or key store that fails answers 503 with Retry-After, in the route's shape.

Real SQLite stores (closed under the running app to make them fail), the real app
factory, Litestar's in-process test client; no provider is called.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from gateway.app import Components, create_app
from gateway.config import load_settings
from gateway.governance import LocalGovernanceStore
from gateway.keys import SqliteKeyStore, TeamLimits
from gateway.policy import StaticPolicySource

BODY = {"model": "mock-gpt", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[tuple[SqliteKeyStore, LocalGovernanceStore, str]]:
    db = str(tmp_path / "mayu.db")
    keys, governance = SqliteKeyStore(db), LocalGovernanceStore(db)
    await keys.open()
    await governance.open()
    await keys.create_team(name="t", limits=TeamLimits(usd_micros_per_day=1_000_000))
    plaintext, _ = await keys.create_key(team="t")
    yield keys, governance, plaintext
    await governance.close()
    await keys.close()


def _app(tmp_path: Path, keys: SqliteKeyStore, governance: LocalGovernanceStore):  # type: ignore[no-untyped-def]
    settings = msgspec.structs.replace(load_settings(None), data_dir=str(tmp_path))
    return create_app(settings, components=Components(
        key_store=keys, governance=governance, policy=StaticPolicySource()))


async def test_governance_store_failure_is_503_with_retry_after(
        tmp_path: Path, parts: tuple[SqliteKeyStore, LocalGovernanceStore, str]) -> None:
    """Admission against a failing governance store: 503 governance_unavailable, Retry-After."""
    keys, governance, key = parts
    app = _app(tmp_path, keys, governance)
    async with AsyncTestClient(app=app) as client:
        ok = await client.post("/v1/chat/completions", json=BODY,
                               headers={"Authorization": f"Bearer {key}"})
        assert ok.status_code == 200
        # Its settlement trails the answer: the store fails after taking it, not during.
        assert await app.state.gateway.governor.caught_up()
        await governance.close()
        r = await client.post("/v1/chat/completions", json=BODY,
                              headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "governance_unavailable"
        m = await client.post("/v1/messages", json={**BODY, "model": "mock-claude"},
                              headers={"x-api-key": key})
        assert m.status_code == 503 and m.json()["error"]["type"] == "overloaded_error"


async def test_key_store_failure_is_503_not_401(
        tmp_path: Path, parts: tuple[SqliteKeyStore, LocalGovernanceStore, str]) -> None:
    """A key store that cannot answer is unavailability (503), never 'unknown key' (401)."""
    keys, governance, key = parts
    async with AsyncTestClient(app=_app(tmp_path, keys, governance)) as client:
        await keys.close()
        r = await client.post("/v1/chat/completions", json=BODY,
                              headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
