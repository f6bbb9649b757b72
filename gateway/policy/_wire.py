"""GovernancePolicy wire types (``apiVersion: inferplane.dev/v1alpha1``).

The YAML/JSON shape operators write, defined once as msgspec Structs and imported by both
``mayu`` and ``inferplaned`` (ADR-031). Field names are camelCase as in a Kubernetes CRD;
unknown fields are forbidden at every level so a typo, or a rule type this build cannot
enforce, is an error with its path instead of being silently ignored.

Bounds that are pure field constraints live here as ``msgspec.Meta`` annotations, so the
structural checker in :mod:`gateway.policy._validate` and msgspec agree on them; rules that
relate several fields (``unlimited`` versus limits, exactly one rule type, ...) live in
the validator.

Example::

    apiVersion: inferplane.dev/v1alpha1
    kind: GovernancePolicy
    metadata: {name: platform}
    spec:
      rules:
        - name: rate
          subject: {kind: team, team: platform}
          failurePolicy: FailOpen
          rate: {rpm: 600, tpm: 200000}
        - name: monthly-spend
          uid: platform-spend-2026        # optional; default "<policy>/<rule name>"
          subject: {kind: team, team: platform}
          failurePolicy: FailClosed
          budget: {limitMilliUSD: 500000, window: month, hardCap: true}
        - name: agent-loops
          subject: {kind: key, key: key_7f3a9c2e}  # or a team / user / team-user subject
          failurePolicy: FailClosed
          concurrency: {maxInFlight: 4}
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gateway.ceilings import (
    MAX_POLICY_IN_FLIGHT,
    MAX_POLICY_MILLI_USD,
    MAX_POLICY_PER_MINUTE,
    MAX_POLICY_TOKENS,
)

API_VERSION = "inferplane.dev/v1alpha1"
KIND = "GovernancePolicy"

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
UID_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$"
DURATION_PATTERN = r"^([0-9]+(ms|s|m|h))+$"
MIN_RENEW_MS = 1_000
"""The shortest lease ``renewInterval`` (1s): a heartbeat is one database transaction."""
MAX_RENEW_MS = 86_400_000
"""The longest lease ``renewInterval`` (24h), the ceiling of every duration a gateway
config accepts: a lease expires after three intervals without an answer, so a longer
one would leave an unreachable control plane unnoticed for days (and the number must
fit the lease protocol's integers and the ledger's bigint)."""

PolicyName = Annotated[str, msgspec.Meta(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
RuleName = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=DNS_LABEL)]
RuleUid = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=UID_PATTERN)]
SubjectName = Annotated[str, msgspec.Meta(min_length=1, max_length=253)]
Duration = Annotated[str, msgspec.Meta(max_length=32, pattern=DURATION_PATTERN)]
PerMinute = Annotated[int, msgspec.Meta(gt=0, le=MAX_POLICY_PER_MINUTE)]
Tokens = Annotated[int, msgspec.Meta(gt=0, le=MAX_POLICY_TOKENS)]
MilliUSD = Annotated[int, msgspec.Meta(gt=0, le=MAX_POLICY_MILLI_USD)]
InFlight = Annotated[int, msgspec.Meta(gt=0, le=MAX_POLICY_IN_FLIGHT)]


# msgspec subclasses inherit frozen=True at runtime, but type checkers follow PEP 681
# (dataclass_transform), which does not inherit it; each subclass repeats frozen=True so
# mypy knows the wire types are immutable (msgspec issue #657).
class _Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
            omit_defaults=True):
    pass


class _Document(_Wire, frozen=True):
    """A policy document of this API version; a kind adds ``kind``, ``metadata`` and
    ``spec`` (in that order: the fields' order on the wire)."""

    api_version: Literal["inferplane.dev/v1alpha1"] = msgspec.field(name="apiVersion")


class ObjectMeta(_Wire, frozen=True):
    name: PolicyName
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class Subject(_Wire, frozen=True):
    """Who a rule applies to; ``*`` as a name means every team (or every user, every key).

    ``kind: key`` names a key by its public id (``key_…``) and takes only a
    ``concurrency`` rule: a key's own rates and money limits are fields of the key."""

    kind: Literal["team", "user", "team-user", "key"]
    team: SubjectName | None = None
    user: SubjectName | None = None
    key: SubjectName | None = None


class RateRule(_Wire, frozen=True):
    """Token buckets: requests and/or tokens per minute, or ``unlimited: true``."""

    unlimited: bool = False
    rpm: PerMinute | None = None
    tpm: PerMinute | None = None


class Lease(_Wire, frozen=True):
    """Budget lease knobs (ADR-034): grant size in milliUSD, heartbeat interval."""

    grant: MilliUSD
    renew_interval: Duration = msgspec.field(name="renewInterval")


class BudgetRule(_Wire, frozen=True):
    """A monetary budget per calendar window, or ``unlimited: true``."""

    unlimited: bool = False
    limit_milli_usd: MilliUSD | None = msgspec.field(default=None, name="limitMilliUSD")
    window: Literal["day", "month"] | None = None
    hard_cap: bool | None = msgspec.field(default=None, name="hardCap")
    """Absent means ``true``; presence is tracked so ``unlimited`` can refuse it."""
    lease: Lease | None = None
    admin_contact: Annotated[str, msgspec.Meta(min_length=1, max_length=253)] | None = (
        msgspec.field(default=None, name="adminContact"))
    on_shortfall: Literal["refuse", "fit"] | None = msgspec.field(default=None,
                                                                  name="onShortfall")
    """``fit``: a request whose worst case does not fit what remains is admitted with its
    max_tokens lowered to the largest value that fits, if at least ``fitFloorTokens``
    (default 1024). Absent or ``refuse``: such requests are refused."""
    fit_floor_tokens: Tokens | None = msgspec.field(default=None, name="fitFloorTokens")


class TokenQuota(_Wire, frozen=True):
    """Token quotas per UTC day and/or month (counts cache tokens too, ADR-039)."""

    day: Tokens | None = None
    month: Tokens | None = None


class ConcurrencyRule(_Wire, frozen=True):
    """At most ``maxInFlight`` requests of the subject open at once (admitted, not yet
    settled), exact across shared replicas; each key, team or team's user named by the
    subject (``*``: each one) has its own slots."""

    max_in_flight: InFlight = msgspec.field(name="maxInFlight")


class Rule(_Wire, frozen=True):
    name: RuleName
    subject: Subject
    failure_policy: Literal["FailOpen", "FailClosed"] = msgspec.field(name="failurePolicy")
    uid: RuleUid | None = None
    """Stable identity of the rule's counters; default ``<policy name>/<rule name>``."""
    rate: RateRule | None = None
    budget: BudgetRule | None = None
    token_quota: TokenQuota | None = msgspec.field(default=None, name="tokenQuota")
    concurrency: ConcurrencyRule | None = None


class PolicySpec(_Wire, frozen=True):
    rules: list[Rule]
    description: str | None = None


class GovernancePolicy(_Document, frozen=True):
    kind: Literal["GovernancePolicy"]
    metadata: ObjectMeta
    spec: PolicySpec


def rule_uid(policy: str, rule: Rule) -> str:
    """The rule's stable uid: explicit, else derived from policy and rule name.

    Deriving it from names keeps it stable across edits, reorderings and restarts; renaming
    a rule (or its policy) without an explicit ``uid`` starts fresh counters, which is why
    operators who rename should pin ``uid``.
    """
    return rule.uid if rule.uid is not None else f"{policy}/{rule.name}"


def duration_ms(text: str) -> int:
    """``"1m30s"`` → 90000. The text already matched :data:`DURATION_PATTERN`."""
    units = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
    total, number = 0, ""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isdigit():
            number += ch
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else ch
        total += int(number) * units[unit]
        number = ""
        i += len(unit)
    return total
