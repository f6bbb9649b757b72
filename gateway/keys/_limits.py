"""Checks both key stores apply before writing a team or a key.

One copy, so a config valid in the local profile is valid in the shared one and the
other way round: same limit names, same ceilings, same error wording.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gateway.ceilings import MAX_AMOUNT, MAX_BUCKET_CAPACITY
from gateway.errors import BadRequest, KeyRevoked, NotFound, RevisionConflict
from gateway.keys._model import KeyChanges, KeyRecord

TEAM_LIMITS = ("rpm", "tpm", "tokens_per_day", "usd_micros_per_day", "usd_micros_per_month",
               "budget_fit_floor")
KEY_LIMITS = ("rpm", "tpm", "usd_micros_per_day", "usd_micros_per_month")
MEMBER_LIMITS = ("tokens_per_day", "usd_micros_per_day", "usd_micros_per_month")


def check_limits(limits: Any, names: tuple[str, ...], where: str) -> None:
    """Refuse a limit that is not a non-negative integer within its ceiling: the planner's
    (``MAX_BUCKET_CAPACITY`` for rpm/tpm, ``MAX_AMOUNT`` for the others), so every limit
    a store accepts is one admission can charge."""
    for name in names:
        value = getattr(limits, name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadRequest(f"{where}.{name}: must be a non-negative integer, got {value!r}")
        if name in ("rpm", "tpm") and value == 0:
            # A zero-capacity bucket would silently mean "no cap" to the planner.
            raise BadRequest(f"{where}.{name}: must be positive (omit it for no cap)")
        ceiling = MAX_BUCKET_CAPACITY if name in ("rpm", "tpm") else MAX_AMOUNT
        if value > ceiling:
            raise BadRequest(f"{where}.{name}: {value} is above the maximum {ceiling}")


def check_new_team(name: str, limits: Any, guardrails: Sequence[str] = ()) -> None:
    """Refuse a team without a name, with an invalid limit or profile name."""
    if not name or not name.strip():
        raise BadRequest("team name: must not be empty")
    check_limits(limits, TEAM_LIMITS, "team limits")
    check_guardrails(guardrails)


MAX_TEAM_GUARDRAILS = 16
"""The most guardrail profiles one team names (docs/guardrails.md, "Per team")."""
_PROFILE = re.compile(r"[a-z][a-z0-9_-]{0,39}")


def check_guardrails(names: Sequence[str]) -> None:
    """Refuse a team's guardrail profile list that is not at most 16 distinct lowercase
    labels; whether each is configured is the gateway's config's to say
    (``gateway.guardrails.check_profiles``), not the store's."""
    if len(names) > MAX_TEAM_GUARDRAILS:
        raise BadRequest(f"guardrails: at most {MAX_TEAM_GUARDRAILS} profiles, got "
                         f"{len(names)}", param="guardrails")
    for name in names:
        if not isinstance(name, str) or not _PROFILE.fullmatch(name):
            raise BadRequest(f"guardrails: {name!r} is not a profile name (a lowercase "
                             "label, at most 40 characters)", param="guardrails")
    if len(set(names)) != len(names):
        raise BadRequest("guardrails: a profile is named twice", param="guardrails")


def check_team_edit(limits: Any, guardrails: Sequence[str] | None) -> None:
    """Refuse a team edit that changes nothing, or whose limits or profile names are
    invalid (what is None is kept)."""
    if limits is None and guardrails is None:
        raise BadRequest("team edit: give the limits or the guardrails to change")
    if limits is not None:
        check_limits(limits, TEAM_LIMITS, "team limits")
    if guardrails is not None:
        check_guardrails(guardrails)


def check_revision(what: str, current: int, expected: int | None) -> None:
    """Refuse an edit made against a revision that is no longer the current one."""
    if expected is not None and expected != current:
        raise RevisionConflict(f"{what} is at revision {current}, not {expected}; "
                               "re-read it and retry")


def editable(what: str, row: Any, expected_revision: int | None) -> Any:
    """``row``, the stored ``what`` an edit is about to change: NotFound when there is
    none, RevisionConflict when it is no longer at ``expected_revision``."""
    if row is None:
        raise NotFound(f"{what} does not exist")
    check_revision(what, row["revision"], expected_revision)
    return row


MAX_USER_CHARS = 200
USER_NAME_RULE = (f"1 to {MAX_USER_CHARS} printable characters, no '/', no leading or "
                  "trailing space ('*' is a team's default member budget, never a user)")
"""The one rule for a user name, wherever one is written (docs/admin-api.md)."""


def check_user_name(user: str, *, default_allowed: bool = False) -> None:
    """Refuse a user name outside :data:`USER_NAME_RULE`: every door that names a user
    (a key's ``user``, a member or user budget, the CLI, an import, the console) writes
    through a key store, which checks here. ``/`` is refused so that every user can be
    addressed in a URL path (``/admin/v1/users/{name}``); ``*`` is the team default."""
    if (not user or len(user) > MAX_USER_CHARS or user != user.strip() or "/" in user
            or any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in user)):
        raise BadRequest(f"user: {user!r} is not a user name ({USER_NAME_RULE})",
                         param="user")
    if user == "*" and not default_allowed:
        raise BadRequest("user: '*' is reserved for a team's default member budget",
                         param="user")


def check_member(user: str, limits: Any, *, default_allowed: bool) -> None:
    """Refuse a member or user budget without a valid user name (:func:`check_user_name`;
    ``*`` where that is not the team's default) or with an invalid limit."""
    check_user_name(user, default_allowed=default_allowed)
    check_limits(limits, MEMBER_LIMITS, "limits")


def check_new_key(limits: Any, user: str | None) -> None:
    """Refuse a new key with an invalid limit or user name."""
    check_limits(limits, KEY_LIMITS, "key limits")
    if user is not None:
        check_user_name(user)


def edited_key(key: KeyRecord, changes: KeyChanges) -> KeyRecord:
    """``key`` as ``changes`` leave it; refused when the key is revoked or the edit
    names an invalid user or limit."""
    if key.revoked_at is not None:
        raise KeyRevoked(f"key {key.id!r} is revoked; it can no longer be edited")
    if isinstance(changes.user, str):
        check_user_name(changes.user)
    new = changes.applied(key)
    check_limits(new.limits, KEY_LIMITS, "key limits")
    return new


def member_what(user: str, team: str) -> str:
    """How an answer names a member budget (``*``: the team's default)."""
    if user == "*":
        return f"the default member budget of team {team!r}"
    return f"member {user!r} of team {team!r}"
