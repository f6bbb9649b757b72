"""Stored rows as records, and records as the limit columns a row holds: one mapping for
both key stores.

The two stores' rows have the same columns; they differ only in how the driver hands back
a time and a list (Postgres: ``datetime`` and arrays; SQLite: ISO text and JSON) and in
the name of a key's user column. Each store states those in its :class:`Rows`, so a field
added to a record is read in one place for both (``mayu keys import`` compares records
read through both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway.keys._limits import KEY_LIMITS, MEMBER_LIMITS, TEAM_LIMITS
from gateway.keys._model import KeyLimits, KeyRecord, Member, MemberLimits, Team, TeamLimits, User


def limit_columns(limits: TeamLimits | KeyLimits | MemberLimits,
                  names: tuple[str, ...]) -> dict[str, Any]:
    """The columns a store writes for ``limits`` (``names``: ``TEAM_LIMITS`` and so on)."""
    return {n: getattr(limits, n) for n in names}


@dataclass(frozen=True, kw_only=True)
class Rows:
    """How one store's rows become records."""

    at: Callable[[Any], datetime | None]
    """A time column's value as a datetime (None stays None)."""
    listed: Callable[[Any], Iterable[str]]
    """A list column's value (not NULL) as its items."""
    key_user: str
    """The column of a key row holding its user."""

    def team(self, row: Any) -> Team:
        return Team(id=row["id"], name=row["name"],
                    limits=TeamLimits(**{n: row[n] for n in TEAM_LIMITS}),
                    revision=row["revision"], region=row["region"],
                    guardrails=tuple(self.listed(row["guardrails"])),
                    created_at=self.at(row["created_at"]))

    def key(self, row: Any) -> KeyRecord:
        models = row["allowed_models"]
        return KeyRecord(
            id=row["id"], team_id=row["team_id"], key_hash=row["key_hash"],
            display_prefix=row["display_prefix"], name=row["name"], user=row[self.key_user],
            allowed_models=None if models is None else tuple(self.listed(models)),
            limits=KeyLimits(**{n: row[n] for n in KEY_LIMITS}),
            expires_at=self.at(row["expires_at"]), revoked_at=self.at(row["revoked_at"]),
            revision=row["revision"], created_at=self.at(row["created_at"]))

    def member(self, row: Any) -> Member:
        return Member(team_id=row["team_id"], user=row["user_name"],
                      limits=MemberLimits(**{n: row[n] for n in MEMBER_LIMITS}),
                      revision=row["revision"], created_at=self.at(row["created_at"]),
                      updated_at=self.at(row["updated_at"]))

    def user(self, row: Any) -> User:
        return User(name=row["name"], email=row["email"], display_name=row["display_name"],
                    limits=MemberLimits(**{n: row[n] for n in MEMBER_LIMITS}),
                    revision=row["revision"], created_at=self.at(row["created_at"]),
                    updated_at=self.at(row["updated_at"]))
