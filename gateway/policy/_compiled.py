"""The enforcement form of GovernancePolicy rules, as the governance seam consumes them.

Wire documents (milliUSD, YAML shape) are compiled into :class:`CompiledRule` values
(µUSD, flat). A :class:`PolicySnapshot` is one published generation: the router captures
it atomically with the rules it routes by, and admission checks the captured generation
against the store's current one (a mismatch is a retryable 503).

Every non-unlimited rule is enforced by its own counters, so a request must pass every
rule that applies to it: most-restrictive-wins holds by construction, and an
``unlimited`` rule charges nothing and can never widen a real cap.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from gateway.policy._kinds import CompiledGuardrails, CompiledRouting

RuleKind = Literal["rate", "budget", "tokenQuota", "concurrency"]
SubjectKind = Literal["team", "user", "team-user", "key"]
FailurePolicy = Literal["FailOpen", "FailClosed"]


class CompiledRule(msgspec.Struct, frozen=True, kw_only=True):
    uid: str
    """Stable rule identity: survives edits, restarts and reordering."""
    policy: str
    kind: RuleKind
    subject: SubjectKind
    team: str | None = None
    """Team *name* the rule applies to (subjects team and team-user); ``*`` = every team."""
    user: str | None = None
    """User the rule applies to (subjects user and team-user); ``*`` = every user."""
    key: str | None = None
    """Key id the rule applies to (subject key); ``*`` = every key."""
    failure_policy: FailurePolicy = "FailClosed"
    unlimited: bool = False
    rpm: int | None = None
    tpm: int | None = None
    limit_micro_usd: int | None = None
    window: Literal["day", "month"] | None = None
    hard_cap: bool = True
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    max_in_flight: int | None = None
    """Concurrency rules: requests of one scope open at once (admitted, not settled)."""
    # Additive (helper D): display and lease-mode fields; enforcement ignores them.
    name: str | None = None
    """The rule's name in its policy document."""
    lease_grant_micro_usd: int | None = None
    lease_renew_ms: int | None = None
    admin_contact: str | None = None
    fit_floor: int | None = None
    """Budget rules with ``onShortfall: fit``: the smallest max_tokens budget fit may
    lower a request to (``fitFloorTokens``, default 1024); None: refuse."""

    def applies_to(self, team_name: str, user: str | None, key_id: str | None = None) -> bool:
        """Whether the rule binds a caller (a key subject only when ``key_id`` is given)."""
        if self.subject == "key":
            return key_id is not None and self.key in ("*", key_id)
        if self.subject in ("team", "team-user") and self.team not in ("*", team_name):
            return False
        if self.subject in ("user", "team-user"):
            return user is not None and self.user in ("*", user)
        return True

    def scope(self, team_name: str, user: str | None, key_id: str | None = None) -> str:
        """The counter scope this rule charges for a caller: ``team=<name>`` for a team
        rule, ``team=<name>,user=<user>`` for a user or team-user rule, ``key=<key id>``
        for a key rule.

        A user is named by its team (a key's ``user`` is unique only within its team), so
        a ``kind: user`` rule charges each team's user on its own counters, exactly like
        ``kind: team-user`` with ``team: '*'``: two teams' "ci" users never share a budget
        or see each other's spend."""
        if self.subject == "team":
            return f"team={team_name}"
        if self.subject == "key":
            return f"key={key_id}"
        return f"team={team_name},user={user}"

    def fits_scope(self, scope: str) -> bool:
        """Whether :meth:`scope` can return ``scope`` for some caller this rule applies
        to (what a lease report of one of its accounts must name)."""
        if self.subject == "key":
            return scope.startswith("key=") and self.key in ("*", scope[4:])
        team, sep, user = scope.partition(",user=")
        if not team.startswith("team=") or bool(sep) == (self.subject == "team"):
            return False
        if self.subject != "user" and self.team not in ("*", team[5:]):
            return False
        return self.subject == "team" or self.user in ("*", user)


class PolicySnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One published generation of the policy set."""

    namespace: str = "local"
    generation: int = 0
    fingerprint: str = ""
    rules: tuple[CompiledRule, ...] = ()
    routing: tuple[CompiledRouting, ...] = ()
    """RoutingPolicy documents: one model's overrides each (docs/routing.md)."""
    guardrails: tuple[CompiledGuardrails, ...] = ()
    """GuardrailPolicy documents: one team's, or the org's, each (docs/guardrails.md)."""

    def rules_for(self, team_name: str, user: str | None,
                  key_id: str | None = None) -> list[CompiledRule]:
        return [r for r in self.rules
                if not r.unlimited and r.applies_to(team_name, user, key_id)]


EMPTY_SNAPSHOT = PolicySnapshot()
