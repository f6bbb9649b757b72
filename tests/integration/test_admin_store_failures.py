"""The admin API when its stores fail: every route answers 503 in OpenAI's shape.

Both profiles, through the real app factory: the local gateway's SQLite stores closed
under it (each call raises), the shared gateway's Postgres pool closed (each call is the
store's own ``GovernanceUnavailable``). Whatever the route (keys, members, users, the
request log, operations), the answer is the same 503 a generation request gets —
``governance_unavailable``, ``Retry-After: 1``, ``x-should-retry: true``, the kind's own
sentence (never the store's error text) — and the failure is a log line.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from tests.integration._admin import READ, WRITE, bearer

pytestmark = pytest.mark.integration

SENTENCE = "Governance storage is unavailable; no request is admitted."
CALLS: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("GET", "/admin/v1/teams", READ, None),
    ("GET", "/admin/v1/teams/ml", READ, None),
    ("POST", "/admin/v1/teams", WRITE, {"name": "t"}),
    ("PUT", "/admin/v1/teams/ml/limits", WRITE, {"rpm": 5}),
    ("GET", "/admin/v1/keys", READ, None),
    ("POST", "/admin/v1/keys/key_x/revoke", WRITE, None),
    ("GET", "/admin/v1/teams/ml/members", READ, None),
    ("PUT", "/admin/v1/teams/ml/members/ana", WRITE, {"tokens_per_day": 5}),
    ("GET", "/admin/v1/teams/ml/default-member", READ, None),
    ("GET", "/admin/v1/users", READ, None),
    ("PUT", "/admin/v1/users/ana", WRITE, {}),
    ("GET", "/admin/v1/requests", READ, None),
    ("GET", "/admin/v1/requests?team=ml", READ, None),  # the team looked up too
    ("GET", "/admin/v1/requests/summary", READ, None),
    ("GET", "/admin/v1/requests/00000000-0000-4000-8000-000000000000", READ, None),
    ("GET", "/admin/v1/permits", READ, None),
    ("GET", "/admin/v1/frozen", READ, None),
    ("POST", "/admin/v1/frozen/unfreeze", WRITE, {"counter": "team:ml:usd:day"}),
]


async def _break_stores(c: AsyncTestClient[Any]) -> None:
    """Close the stores on the app's own loop (the client's portal thread)."""
    gw = c.app.state.gateway

    async def close() -> None:
        if gw.pool is not None:
            await gw.pool.close()
        else:
            await gw.key_store.close()
            await gw.governance.close()
    await asyncio.to_thread(c.blocking_portal.call, close)


async def test_every_admin_route_answers_503_when_its_store_fails(
        admin: tuple[AsyncTestClient[Any], Path], caplog: pytest.LogCaptureFixture) -> None:
    """A store failure on any admin route is the 503 ``governance_unavailable`` with
    ``Retry-After: 1``, its sentence only, and a log line (never a 500)."""
    c, _ = admin
    await _break_stores(c)
    for method, path, token, body in CALLS:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            r = await c.request(method, path, json=body, headers=bearer(token))
        assert r.status_code == 503, (method, path, r.status_code, r.text)
        assert r.json() == {"error": {"message": SENTENCE, "type": "server_error",
                                      "param": None, "code": "governance_unavailable"}}
        assert r.headers["retry-after"] == "1" and r.headers["x-should-retry"] == "true"
        assert any("503" in m for m in caplog.messages), (path, caplog.messages)
