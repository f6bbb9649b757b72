"""A team's members from the key store (``team_members``), the same on SQLite and Postgres.

The one answer the admin API's members routes and ``mayu members list`` show: every user
with a member budget in the team or holding one of its keys (revoked ones too), the
budget that binds each (their own, else the team's default, else none) and the default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import NotFound
from gateway.keys import DEFAULT_MEMBER, MemberLimits, PostgresKeyStore, SqliteKeyStore

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """A fresh key store of each kind."""
    if request.param == "sqlite":
        sqlite = SqliteKeyStore(str(tmp_path / "mayu.db"))
        await sqlite.open()
        yield sqlite
        await sqlite.close()
        return
    from gateway.config import DatabaseSettings
    from gateway.db import open_pool

    request.getfixturevalue("monkeypatch").setenv("INFERPLANE_DATABASE_URL",
                                                  request.getfixturevalue("pg_dsn"))
    pool = open_pool(DatabaseSettings(pool_min_size=1, pool_max_size=2))
    await pool.open(wait=True)
    yield PostgresKeyStore(pool)
    await pool.close()


async def test_team_members_names_each_user_with_the_budget_that_binds_them(
        store: Any) -> None:
    """ana (her own budget, two keys, one revoked), bob (a key: the default binds him),
    cy (a budget, no key), a key without a user (no member), another team's dee (not
    listed); without a default, bob's source is ``none``; an unknown team is NotFound."""
    team = await store.create_team(name="ml")
    await store.create_team(name="other")
    await store.create_key(team="ml", user="ana")
    _, revoked = await store.create_key(team="ml", user="ana")
    await store.revoke_key(revoked.id)
    await store.create_key(team="ml", user="bob")
    await store.create_key(team="ml")
    await store.create_key(team="other", user="dee")
    own = await store.put_member("ml", "ana", limits=MemberLimits(usd_micros_per_day=3_000))
    await store.put_member("ml", "cy", limits=MemberLimits(tokens_per_day=100))
    found = await store.team_members("ml")
    assert (found.team_id, found.default) == (team.id, None)
    assert [(m.user, m.source, m.keys, m.revision) for m in found.members] == [
        ("ana", "member", 2, own.revision), ("bob", "none", 1, 0), ("cy", "member", 0, 1)]
    assert found.members[0].limits == MemberLimits(usd_micros_per_day=3_000)
    assert found.members[0].created_at == own.created_at

    default = await store.put_member("ml", DEFAULT_MEMBER,
                                     limits=MemberLimits(usd_micros_per_month=9_000))
    found = await store.team_members(team.id)  # by id as by name
    assert found.default == default
    bob = found.members[1]
    assert (bob.user, bob.source, bob.limits, bob.revision, bob.created_at) == (
        "bob", "default", MemberLimits(usd_micros_per_month=9_000), 0, None)
    with pytest.raises(NotFound, match="team 'nope' does not exist"):
        await store.team_members("nope")
