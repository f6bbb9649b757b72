"""First-run conveniences for the local profile: a demo team and key, declared teams.

``mayu serve`` with no configuration must let a newcomer try the gateway offline, so on
the very first run (no team at all) it creates team ``demo`` with modest limits and one
key whose plaintext is returned exactly once. Works on any :class:`KeyStore`.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gateway.config import BootstrapTeam
from gateway.errors import ConfigError
from gateway.keys._model import KeyStore, TeamLimits

DEMO_TEAM = "demo"
# Modest on purpose: enough to try every endpoint, small enough that a leaked demo key
# cannot spend more than a dollar a day.
DEMO_LIMITS = TeamLimits(rpm=60, tpm=100_000, tokens_per_day=2_000_000,
                         usd_micros_per_day=1_000_000, usd_micros_per_month=10_000_000)


async def ensure_demo(store: KeyStore) -> str | None:
    """Create team ``demo`` and a key on first run; the plaintext key, or None later."""
    if await store.list_teams():
        return None
    await store.create_team(name=DEMO_TEAM, limits=DEMO_LIMITS)
    plaintext, _ = await store.create_key(team=DEMO_TEAM, name="demo")
    return plaintext


async def ensure_teams(store: KeyStore, declared: Sequence[BootstrapTeam]) -> list[str]:
    """Create the teams declared in config (``bootstrap_teams``); the names created.

    A declared team that already exists with the same limits is left alone; one that
    exists with different limits refuses startup, naming the config key, because a
    silent overwrite would undo an operator's later edit.
    """
    declare = getattr(store, "declare_teams", None)
    if declare is not None:  # shared key store: immutable declarations (ADR-046)
        names: list[str] = await declare(declared)
        return names
    created = []
    for i, decl in enumerate(declared):
        fields = msgspec.structs.asdict(decl)
        fields.pop("name")
        limits = TeamLimits(**fields)
        team = await store.get_team(decl.name)
        if team is None:
            await store.create_team(name=decl.name, limits=limits)
            created.append(decl.name)
        elif team.limits != limits:
            raise ConfigError(f"bootstrap_teams[{i}]: team {decl.name!r} already exists with "
                              f"different limits ({team.limits}); edit it with the CLI "
                              "or make the declaration match")
    return created
