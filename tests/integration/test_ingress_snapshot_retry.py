"""A key or team changed between authentication and admission is re-resolved, not 503'd.

Real SQLite stores sharing one file (so admission re-checks the key and team rows), the
real app factory, Litestar's in-process test client. The change is made by a governance
store that performs a real key-store write just before its first admission, which is
exactly the window a concurrent ``mayu keys revoke`` / ``mayu teams set`` can hit.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gateway.governance import AdmissionRequest, LocalGovernanceStore, Permit, Refusal
from gateway.governance._governor import MAX_SNAPSHOT_RETRIES, MAX_SNAPSHOT_ROUNDS
from gateway.keys import SqliteKeyStore, TeamLimits
from tests.integration._inapp import app_on

BODY = {"model": "mock-gpt", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


class ChangeFirst(LocalGovernanceStore):
    """The real local store, running one key-store write before its first admission."""

    def __init__(self, path: str, change: Callable[[], Awaitable[object]]) -> None:
        super().__init__(path)
        self._change: Callable[[], Awaitable[object]] | None = change
        self.decisions: list[Permit | Refusal] = []

    async def admit(self, requests: list[AdmissionRequest]) -> list[Permit | Refusal]:
        if self._change is not None:
            change, self._change = self._change, None
            await change()
        out = await super().admit(requests)
        self.decisions += out
        return out


@pytest.fixture
async def keys(tmp_path: Path) -> AsyncIterator[SqliteKeyStore]:
    store = SqliteKeyStore(str(tmp_path / "mayu.db"))
    await store.open()
    yield store
    await store.close()


async def _call(tmp_path: Path, keys: SqliteKeyStore, governance: ChangeFirst,
                key: str) -> tuple[int, dict[str, object], str]:
    async with app_on(tmp_path, keys, governance) as client:
        r = await client.post("/v1/chat/completions", json=BODY,
                              headers={"Authorization": f"Bearer {key}"})
        metrics = (await client.get("/metrics")).text
    return r.status_code, r.json(), metrics


async def test_key_revoked_before_admission_is_401(tmp_path: Path,
                                                   keys: SqliteKeyStore) -> None:
    """A key revoked between authentication and admission gets 401, not a 503 or a 200."""
    await keys.create_team(name="t")
    plaintext, record = await keys.create_key(team="t")
    governance = ChangeFirst(str(tmp_path / "mayu.db"), lambda: keys.revoke_key(record.id))
    status, body, metrics = await _call(tmp_path, keys, governance, plaintext)
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert [type(d) for d in governance.decisions] == [Refusal]
    assert 'mayu_snapshot_retries_total{changed="key"} 1.0' in metrics


async def test_team_edited_before_admission_is_admitted_with_new_limits(
        tmp_path: Path, keys: SqliteKeyStore) -> None:
    """A team edited between authentication and admission: re-planned with its new
    revision and limits, admitted (200), the mismatch never reaches the client."""
    await keys.create_team(name="t", limits=TeamLimits(usd_micros_per_day=10**9))
    plaintext, _ = await keys.create_key(team="t")
    governance = ChangeFirst(str(tmp_path / "mayu.db"), lambda: keys.update_team(
        "t", limits=TeamLimits(usd_micros_per_day=2 * 10**9)))
    status, _, metrics = await _call(tmp_path, keys, governance, plaintext)
    assert status == 200
    refusal, permit = governance.decisions
    assert isinstance(refusal, Refusal) and refusal.status == 503
    assert isinstance(permit, Permit) and permit.request.team_revision == 2
    day = [c for c in permit.request.charges if c.counter.startswith("team:")
           and ":usd:day:" in c.counter]
    assert [c.limit for c in day] == [2 * 10**9]
    assert 'mayu_snapshot_retries_total{changed="team"} 1.0' in metrics


async def test_a_mismatch_on_every_round_ends_as_503_after_the_rounds_cap(
        tmp_path: Path, keys: SqliteKeyStore) -> None:
    """The team edited before every admission: each re-plan sees a newer revision (so it
    goes on past MAX_SNAPSHOT_RETRIES), and ends at MAX_SNAPSHOT_ROUNDS as a 503
    snapshot_mismatch with Retry-After."""
    await keys.create_team(name="t")
    plaintext, _ = await keys.create_key(team="t")
    edits = iter(range(2, 100))

    class EditAlways(ChangeFirst):
        async def admit(self, requests: list[AdmissionRequest]) -> list[Permit | Refusal]:
            self._change = lambda: keys.update_team("t", limits=TeamLimits(rpm=next(edits)))
            return await super().admit(requests)

    governance = EditAlways(str(tmp_path / "mayu.db"), lambda: keys.list_teams())
    async with app_on(tmp_path, keys, governance) as client:
        r = await client.post("/v1/chat/completions", json=BODY,
                              headers={"x-api-key": plaintext})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["code"] == "snapshot_mismatch"
    assert len(governance.decisions) == MAX_SNAPSHOT_ROUNDS + 1 and all(
        isinstance(d, Refusal) for d in governance.decisions)
    [changed] = {d.counter for d in governance.decisions}  # type: ignore[union-attr]
    assert changed is not None and changed.startswith("team:")


async def test_a_mismatch_no_re_plan_can_clear_ends_after_the_retries(
        tmp_path: Path, keys: SqliteKeyStore) -> None:
    """Admission reads a file where the team was edited, the gateway resolves keys from a
    copy taken before the edit: every re-plan brings the same stale revision, so it ends
    after MAX_SNAPSHOT_RETRIES (not MAX_SNAPSHOT_ROUNDS) as a 503 snapshot_mismatch."""
    await keys.create_team(name="t")
    plaintext, _ = await keys.create_key(team="t")
    await keys.close()
    stale_copy = tmp_path / "stale.db"
    shutil.copyfile(tmp_path / "mayu.db", stale_copy)
    await keys.open()
    await keys.update_team("t", limits=TeamLimits(rpm=7))
    stale = SqliteKeyStore(str(stale_copy))
    await stale.open()
    governance = ChangeFirst(str(tmp_path / "mayu.db"), lambda: keys.list_teams())
    try:
        status, body, metrics = await _call(tmp_path, stale, governance, plaintext)
    finally:
        await stale.close()
    assert status == 503 and body["error"]["code"] == "snapshot_mismatch"
    assert len(governance.decisions) == MAX_SNAPSHOT_RETRIES + 1
    assert f'mayu_snapshot_retries_total{{changed="team"}} {MAX_SNAPSHOT_RETRIES}.0' in metrics
