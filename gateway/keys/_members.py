"""A team's members: every user of a team with the member budget that binds them.

A user belongs to a team when it has a member budget there or holds one of the team's
keys (revoked ones too). What binds them is their own budget, else the team's default
member budget (``DEFAULT_MEMBER``), else nothing. :func:`team_members_of` works this out
from the rows both key stores read (``team_members``, in one transaction); the admin
API's members routes and ``mayu members list`` show its answer.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

import msgspec

from gateway.keys._model import DEFAULT_MEMBER, KeyRecord, Member, MemberLimits, Team

Label = Annotated[str, msgspec.Meta(max_length=320, pattern=r"^[^\x00-\x1f\x7f-\x9f]*$")]
"""A user's email or display name: at most 320 characters, no control characters."""


class TeamMember(msgspec.Struct, frozen=True, kw_only=True):
    """One user of a team and the member budget that binds them there."""

    team_id: str
    user: str
    """The user's name (the ``user`` of their keys)."""
    limits: MemberLimits
    """What binds the user in this team: its own budget, else the team's default."""
    source: Literal["member", "default", "none"]
    """``member``: its own budget; ``default``: the team's default member budget (no row
    of its own); ``none``: neither exists, so no member budget binds."""
    revision: int
    """Of its own budget (0: none yet); compare with If-Match on a write."""
    keys: int
    """How many of the team's keys (revoked ones too) name this user."""
    created_at: datetime | None = None
    updated_at: datetime | None = None


class TeamMembers(msgspec.Struct, frozen=True, kw_only=True):
    """A team's members by name, and its default member budget (None: none)."""

    team_id: str
    members: list[TeamMember]
    default: Member | None


def member_of(team_id: str, user: str, own: Member | None, default: Member | None,
              keys: int) -> TeamMember:
    """The user with the budget that binds them: ``own``, else ``default``, else none."""
    if own is not None:
        return TeamMember(team_id=team_id, user=user, limits=own.limits, source="member",
                          revision=own.revision, keys=keys, created_at=own.created_at,
                          updated_at=own.updated_at)
    return TeamMember(team_id=team_id, user=user,
                      limits=default.limits if default else MemberLimits(),
                      source="default" if default else "none", revision=0, keys=keys)


def team_members_of(team: Team, rows: list[Member], keys: list[KeyRecord]) -> TeamMembers:
    """The team's members from its member rows (its default among them) and its keys."""
    own = {m.user: m for m in rows if m.user != DEFAULT_MEMBER}
    default = next((m for m in rows if m.user == DEFAULT_MEMBER), None)
    counts: dict[str, int] = {}
    for key in keys:
        if key.user is not None:
            counts[key.user] = counts.get(key.user, 0) + 1
    users = sorted(own.keys() | counts.keys())
    return TeamMembers(team_id=team.id, default=default, members=[
        member_of(team.id, u, own.get(u), default, counts.get(u, 0)) for u in users])
