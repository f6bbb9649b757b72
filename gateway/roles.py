"""Roles: who a person signed in through an OIDC issuer is to the console and the admin API.

Configured per issuer (``identity.issuers[i].roles``): the groups (the issuer's groups
claim, before any team alias) that make a person an ``admin`` (reads and writes
everything), a ``reader`` (reads everything), or a ``team_lead`` (reads their own teams
only: the teams their groups map to); anyone else the issuer vouches for is a
``member`` (their own budget and requests). The first role that matches wins, in that
order. ``console`` registers the console as a client of the issuer (authorization code
with PKCE, docs/console.md), its secret by reference only.

This module imports nothing of the gateway: the identity settings refer to
:class:`RoleSettings`, and the console and the admin API read a :class:`Role`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec

RoleName = Literal["admin", "reader", "team_lead", "member"]
ROLES: tuple[RoleName, ...] = ("admin", "reader", "team_lead", "member")
Group = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Tier = Literal["write", "read", "key"]
PREFIX = "oidc:"
"""A console session's subject for a person signed in through an issuer."""


class ConsoleClient(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The console as a client of this issuer (authorization code + PKCE S256)."""

    client_id: Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
    """The console's client id at the issuer (also an accepted ``aud`` of its ID tokens:
    list it in the issuer's ``audience``)."""
    client_secret_ref: str | None = None
    """``env:``/``file:`` reference to a confidential client's secret (none: a public
    client, PKCE only)."""
    scopes: list[Annotated[str, msgspec.Meta(pattern=r"^[!#-\[\]-~]{1,128}$")]] = (
        msgspec.field(default_factory=lambda: ["openid", "email", "profile"]))
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "single sign-on"
    """The sign-in button's words ("Sign in with …")."""
    redirect_uri: Annotated[str, msgspec.Meta(
        pattern=r"^https?://[^\s?#]{1,2000}/console/sso/callback$")] | None = None
    """The callback URL registered at the issuer (unset: the visitor's own scheme and
    host, as a trusted proxy forwards them, and ``/console/sso/callback``)."""


class RoleSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``roles:`` of one issuer: groups per role, and the console's client."""

    admin: list[Group] = []
    reader: list[Group] = []
    team_lead: list[Group] = []
    console: ConsoleClient | None = None


@dataclass(frozen=True)
class Role:
    """A signed-in person's role, with who they are and the teams their groups map to."""

    name: RoleName
    user: str
    teams: tuple[str, ...]
    issuer: str

    @property
    def tier(self) -> Tier:
        """The console session tier: write (admin), read (reader, team lead), key
        (member: their own things, as a key holder)."""
        return ("write" if self.name == "admin" else "key" if self.name == "member"
                else "read")

    @property
    def every_team(self) -> bool:
        return self.name in ("admin", "reader")

    def subject(self) -> str:
        """The console session's subject: ``oidc:`` and this role, parsed back by
        :meth:`parse`."""
        return PREFIX + json.dumps([self.name, self.user, list(self.teams), self.issuer],
                                   separators=(",", ":"))

    @classmethod
    def parse(cls, subject: str) -> Role | None:
        """The role a session subject names, or None (not an ``oidc:`` subject)."""
        if not subject.startswith(PREFIX):
            return None
        try:
            name, user, teams, issuer = json.loads(subject[len(PREFIX):])
        except ValueError:
            return None
        named = next((n for n in ROLES if n == name), None)
        if named is None:
            return None
        return cls(name=named, user=str(user), teams=tuple(str(t) for t in teams),
                   issuer=str(issuer))


def role_of(settings: RoleSettings | None, *, issuer: str, user: str,
            groups: Iterable[str], teams: Iterable[str]) -> Role:
    """The role ``settings`` give a person of ``issuer`` with these groups (the raw
    claim) and teams (the groups after the issuer's team aliases)."""
    held = set(groups)
    order: tuple[tuple[RoleName, list[str]], ...] = (
        () if settings is None else (("admin", settings.admin), ("reader", settings.reader),
                                     ("team_lead", settings.team_lead)))
    member: RoleName = "member"
    chosen = next((name for name, listed in order if held.intersection(listed)), member)
    return Role(name=chosen, user=user, teams=tuple(teams), issuer=issuer)
