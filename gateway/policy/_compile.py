"""Compilation of GovernancePolicy documents into enforcement rules.

:func:`compile_documents` is the one gate every policy set passes before it is enforced
(local files, ``inferplaned`` publish, the shared Postgres source): it validates the
whole set and either returns one :class:`CompiledRule` per rule or raises
:class:`PolicyInvalid` listing every problem of every document. milliUSD become µUSD by
exact integer multiplication; ``unlimited`` rules are kept, flagged, so audits and views
can tell a deliberate "no cap" from an absent rule (ADR-039).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import msgspec

from gateway.policy._compiled import CompiledRule
from gateway.policy._kinds import (
    CompiledGuardrails,
    CompiledRouting,
    GuardrailPolicy,
    RoutingPolicy,
    compile_guardrails,
    compile_routing,
)
from gateway.policy._validate import Document, PolicyInvalid, validate_documents
from gateway.policy._wire import GovernancePolicy, Rule, duration_ms, rule_uid

MICRO_PER_MILLI = 1000


DEFAULT_FIT_FLOOR = 1024
"""``onShortfall: fit`` without ``fitFloorTokens``: never lower max_tokens below this."""

def _subject(rule: Rule) -> dict[str, Any]:
    s = rule.subject
    return {"subject": s.kind, "team": s.team, "user": s.user, "key": s.key}


def compile_rule(policy: str, rule: Rule) -> CompiledRule:
    """One validated wire rule → its enforcement form."""
    common: dict[str, Any] = {"uid": rule_uid(policy, rule), "policy": policy,
                              "name": rule.name, "failure_policy": rule.failure_policy,
                              **_subject(rule)}
    if rule.rate is not None:
        r = rule.rate
        return CompiledRule(kind="rate", unlimited=r.unlimited, rpm=r.rpm, tpm=r.tpm,
                            **common)
    if rule.concurrency is not None:
        return CompiledRule(kind="concurrency",
                            max_in_flight=rule.concurrency.max_in_flight, **common)
    if rule.token_quota is not None:
        q = rule.token_quota
        return CompiledRule(kind="tokenQuota", tokens_per_day=q.day,
                            tokens_per_month=q.month, **common)
    b = rule.budget
    assert b is not None  # validated: exactly one rule type
    limit = None if b.limit_milli_usd is None else b.limit_milli_usd * MICRO_PER_MILLI
    lease = b.lease
    return CompiledRule(
        kind="budget", unlimited=b.unlimited, limit_micro_usd=limit, window=b.window,
        hard_cap=b.hard_cap is not False and not b.unlimited,
        lease_grant_micro_usd=None if lease is None else lease.grant * MICRO_PER_MILLI,
        lease_renew_ms=None if lease is None else duration_ms(lease.renew_interval),
        admin_contact=b.admin_contact,
        fit_floor=(b.fit_floor_tokens or DEFAULT_FIT_FLOOR) if b.on_shortfall == "fit" else None,
        **common)


def decode_documents(docs: Sequence[dict[str, Any] | Document], *,
                     origins: Sequence[str] | None = None) -> list[Document]:
    """Validate a set and return its typed documents (every kind) sorted by name, or
    raise."""
    policies, problems = validate_documents(docs, origins=origins)
    if problems:
        raise PolicyInvalid(problems)
    return sorted(policies, key=lambda p: p.metadata.name)


def compile_documents(docs: Sequence[dict[str, Any] | Document], *,
                      origins: Sequence[str] | None = None) -> tuple[CompiledRule, ...]:
    """Validate and compile a whole policy set, all or nothing: the GovernancePolicy
    rules (the other kinds are validated too; :func:`compile_all` returns them).

    Rules come out ordered by policy name, then document order, whatever order the
    documents were given in, so equal sets compile to equal tuples.
    """
    return compile_all(docs, origins=origins)[0]


Compiled = tuple[tuple[CompiledRule, ...], tuple[CompiledRouting, ...],
                 tuple[CompiledGuardrails, ...]]


def compile_all(docs: Sequence[dict[str, Any] | Document], *,
                origins: Sequence[str] | None = None) -> Compiled:
    """Validate a whole set (all or nothing) and compile every kind: the governance
    rules, the routing overrides, the guardrail documents (each ordered by name)."""
    decoded = decode_documents(docs, origins=origins)
    rules = tuple(compile_rule(p.metadata.name, rule) for p in decoded
                  if isinstance(p, GovernancePolicy) for rule in p.spec.rules)
    routing = tuple(r for p in decoded if isinstance(p, RoutingPolicy)
                    for r in compile_routing(p))
    guardrails = tuple(compile_guardrails(p) for p in decoded
                       if isinstance(p, GuardrailPolicy))
    return rules, routing, guardrails


def canonical_json(docs: Sequence[dict[str, Any] | Document]) -> bytes:
    """Canonical JSON of a document set: sorted by name, sorted keys, no whitespace."""
    plain = [d if isinstance(d, dict) else msgspec.to_builtins(d) for d in docs]
    plain.sort(key=lambda d: str((d.get("metadata") or {}).get("name", "")))
    return json.dumps(plain, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def fingerprint(docs: Sequence[dict[str, Any] | Document]) -> str:
    """sha256 (hex) of :func:`canonical_json`: equal sets, equal fingerprints."""
    return hashlib.sha256(canonical_json(docs)).hexdigest()
