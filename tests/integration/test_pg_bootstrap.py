"""Replica bootstrap declarations on the shared key store (ADR-046)."""

from __future__ import annotations

import pytest

from gateway.config import BootstrapTeam
from gateway.errors import ConfigError
from gateway.keys import PostgresKeyStore, TeamLimits, ensure_teams


async def test_declarations_are_immutable_and_never_undo_admin_edits(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """The first declaration creates the team; a repeat (another replica) changes nothing,
    even after an admin edit; a different declaration refuses startup naming its key."""
    store = PostgresKeyStore(pg_pool)
    decl = [BootstrapTeam(name="ops", tpm=1_000), BootstrapTeam(name="ml", rpm=5)]
    assert await ensure_teams(store, decl) == ["ops", "ml"]
    ops = await store.get_team("ops")
    assert ops is not None and ops.limits == TeamLimits(tpm=1_000)
    edited = await store.update_team("ops", limits=TeamLimits(tpm=50))
    assert await ensure_teams(PostgresKeyStore(pg_pool), decl) == []  # a second replica
    assert (await store.get_team("ops")) == edited
    with pytest.raises(ConfigError, match=r"bootstrap_teams\[1\]: team 'ml' was first "
                                          "declared with other limits"):
        await ensure_teams(store, [decl[0], BootstrapTeam(name="ml", rpm=6)])


async def test_declaration_of_an_existing_team_keeps_it(pg_pool) -> None:  # type: ignore[no-untyped-def]
    """Declaring a team that an operator already created registers it without changes."""
    store = PostgresKeyStore(pg_pool)
    made = await store.create_team(name="ops", limits=TeamLimits(rpm=1))
    assert await ensure_teams(store, [BootstrapTeam(name="ops", rpm=2)]) == []
    assert await store.get_team("ops") == made
