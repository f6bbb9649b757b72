"""How many store decisions one admission makes (``gateway.governance._admission``).

A normal request is decided once; one admitted after budget fit or after its input was
refined by the provider's count twice; and however the key store and the budget move
while it is being admitted, never more than ``MAX_DECISIONS``. Counted from the
gateway's own ``mayu_admission_seconds`` histogram (one observation per store decision),
through the real app factory on the local (SQLite) and shared (Postgres) profiles.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from gateway.governance import (
    MAX_DECISIONS,
    AdmissionRequest,
    LocalGovernanceStore,
    Permit,
    Refusal,
)
from gateway.keys import SqliteKeyStore, TeamLimits
from tests.integration._admin import WRITE
from tests.integration._inapp import app_on

pytestmark = pytest.mark.integration

CHAT = {"model": "mock-gpt", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
FIT = {**CHAT, "max_tokens": 8192}
"""Its worst case (8,192 output tokens at 4 µUSD) does not fit 20,000 µUSD; 4,000 do."""
LONG = {"model": "mock-claude", "max_tokens": 16,
        "messages": [{"role": "user", "content": "hello " * 3000}]}
"""18 KB of text: bounded by its bytes it does not fit 10,000 µUSD, counted it does."""


@pytest.fixture
def gateway(admin: tuple[AsyncTestClient[Any], Path]) -> AsyncTestClient[Any]:
    """The ``admin`` fixture's client: a fresh gateway (both profiles, the built-in mock
    models) with a write admin token."""
    return admin[0]


def _decisions(metrics: str) -> int:
    found = re.search(r"^mayu_admission_seconds_count ([0-9.]+)$", metrics, re.M)
    return int(float(found.group(1))) if found else 0


async def _team(c: AsyncTestClient[Any], name: str, limits: dict[str, int]) -> str:
    admin = {"Authorization": f"Bearer {WRITE}"}
    r = await c.post("/admin/v1/teams", json={"name": name, "limits": limits},
                     headers=admin)
    assert r.status_code in (200, 201), r.text
    r = await c.post("/admin/v1/keys", json={"team": name}, headers=admin)
    assert r.status_code in (200, 201), r.text
    return str(r.json()["secret"])


async def _decided(c: AsyncTestClient[Any], path: str, body: dict[str, Any],
                   key: str) -> tuple[int, dict[str, str], int]:
    before = _decisions((await c.get("/metrics")).text)
    r = await c.post(path, json=body, headers={"Authorization": f"Bearer {key}"})
    after = _decisions((await c.get("/metrics")).text)
    return r.status_code, dict(r.headers), after - before


async def test_store_decisions_of_a_normal_a_fitted_and_a_refined_request(
        gateway: AsyncTestClient[Any]) -> None:
    """Normal: 1 store decision; budget fit: 2 (refused, then admitted fitted); a
    refined input: 2 (refused on the byte bound, admitted on the count) — each within
    MAX_DECISIONS, on both stores."""
    c = gateway
    normal = await _team(c, "normal", {"usd_micros_per_day": 10**9})
    fitted = await _team(c, "fitted", {"usd_micros_per_day": 20_000, "budget_fit_floor": 16})
    refined = await _team(c, "refined", {"usd_micros_per_day": 10_000})
    status, _, n = await _decided(c, "/v1/chat/completions", CHAT, normal)
    assert (status, n) == (200, 1)
    status, headers, n = await _decided(c, "/v1/chat/completions", FIT, fitted)
    assert (status, n) == (200, 2) and "x-inferplane-budget-fit" in headers
    status, headers, n = await _decided(c, "/v1/messages", LONG, refined)
    assert (status, n) == (200, 2) and headers["x-inferplane-input-bound"] == "counted"
    assert MAX_DECISIONS == 18


class _Moving(LocalGovernanceStore):
    """The real local store, with the team edited (a real key-store write) before every
    admission but each 13th: a snapshot mismatch twelve times, then the budget."""

    def __init__(self, path: str, edit: Callable[[int], Any]) -> None:
        super().__init__(path)
        self.edit, self.decisions = edit, 0

    async def admit(self, requests: list[AdmissionRequest]) -> list[Permit | Refusal]:
        self.decisions += 1
        if self.decisions % 13:
            await self.edit(self.decisions)
        return await super().admit(requests)


async def test_an_admission_never_makes_more_than_max_decisions(tmp_path: Path) -> None:
    """A team edited again and again while a request that needs budget fit is admitted:
    the snapshot rounds and the tighter bounds share one budget, so the request ends (a
    503 snapshot_mismatch the client retries) after 12 re-plans, the fit and the 14th
    store decision, within MAX_DECISIONS."""
    keys = SqliteKeyStore(str(tmp_path / "mayu.db"))
    await keys.open()
    limits = TeamLimits(usd_micros_per_day=20_000, budget_fit_floor=16)
    await keys.create_team(name="t", limits=limits)
    plaintext, _ = await keys.create_key(team="t")
    governance = _Moving(str(tmp_path / "mayu.db"), lambda n: keys.update_team(
        "t", limits=msgspec.structs.replace(limits, rpm=1_000 + n)))
    try:
        async with app_on(tmp_path, keys, governance) as client:
            r = await client.post("/v1/chat/completions", json=FIT,
                                  headers={"x-api-key": plaintext})
    finally:
        await keys.close()
    assert r.status_code == 503 and r.json()["error"]["code"] == "snapshot_mismatch"
    assert governance.decisions == 14 <= MAX_DECISIONS
