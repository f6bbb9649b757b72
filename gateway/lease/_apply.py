"""Per-document application of the control plane's policy set on a lease-profile plane.

Unlike the local file source (all or nothing), each distributed document applies on its
own (ADR-034 §4): one this build cannot enforce is kept out of the applied set and
reported on the next heartbeat as a :class:`Rejection`, and the others apply. "Cannot
enforce" is what this build's validator refuses (version skew: an unknown field or rule
type) and what the lease profile cannot hold exactly: ``tokenQuota`` needs one shared
counter across planes (ADR-046), so it is rejected here and enforced by the shared
profile. RoutingPolicy and GuardrailPolicy documents apply like the shared profile's
(:mod:`gateway.policy._overlay`); a RoutingPolicy naming a model or deployment this plane
does not have is rejected (no gate: the config file's routing stays), and a rejected
GuardrailPolicy gates its subject team (the org's: every team), fail closed.

A rejected document is never silently ignored: each of its ``FailClosed`` rules (a rule
whose ``failurePolicy`` is missing or unreadable counts as FailClosed) becomes a *gate*
that refuses every request it would have applied to, naming the rule and the reason;
its ``FailOpen`` rules are dropped, as their policy asks. A gate is carried in the
snapshot as a budget rule that is never charged (uid ``rejected:<policy>/<rule>``, a
form no published uid can take, since uids cannot hold ``:``): the planner then hands
:class:`gateway.lease.LeaseGovernanceStore` a charge naming it, and the store refuses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from gateway.lease._wire import Problem, Rejection
from gateway.policy import (
    CompiledGuardrails,
    CompiledRouting,
    CompiledRule,
    PolicyInvalid,
    PolicySnapshot,
    compile_all,
    routing_problems,
    validate_document,
)

GATE_PREFIX = "rejected:"


class ManagedRule(msgspec.Struct, frozen=True, kw_only=True):
    """A budget rule the lease store acts on: clamped to its lease, or a gate."""

    uid: str
    fail_open: bool = False
    hard: bool = True
    gate: str | None = None
    """Set for a rejected FailClosed rule: the refusal every request it covers gets."""


class AppliedPolicy(msgspec.Struct, frozen=True, kw_only=True):
    snapshot: PolicySnapshot
    rejections: tuple[Rejection, ...] = ()
    managed: dict[str, ManagedRule] = {}


EMPTY_APPLIED = AppliedPolicy(snapshot=PolicySnapshot(namespace="lease"))


def lease_problems(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What the lease profile cannot enforce in a (structurally valid) document."""
    spec = doc.get("spec")
    rules = spec.get("rules") if isinstance(spec, dict) else None
    out = []
    for i, rule in enumerate(rules if isinstance(rules, list) else []):
        if isinstance(rule, dict) and rule.get("tokenQuota") is not None:
            out.append((f"spec.rules[{i}].tokenQuota",
                        "not supported in the lease profile: a token quota needs one "
                        "counter shared by every gateway (the shared profile enforces "
                        "it); this data plane keeps the document out"))
    return out


def _problems(doc: Any) -> list[tuple[str, str]]:
    _, problems = validate_document(doc)
    if not problems and isinstance(doc, dict):
        problems = lease_problems(doc)
    return problems


def _name(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _gate(policy: str, index: int, rule: dict[str, Any], reason: str) -> CompiledRule:
    """The never-charged rule that stands for a rejected FailClosed rule."""
    name = _name(rule.get("name")) or f"rules[{index}]"
    raw = rule.get("subject")
    subject: dict[str, Any] = raw if isinstance(raw, dict) else {}
    kind = subject.get("kind")
    team, user = _name(subject.get("team")), _name(subject.get("user"))
    readable = (kind == "team" and team) or (kind == "user" and user) or (
        kind == "team-user" and team and user)
    s_kind: Literal["team", "user", "team-user"] = "team"
    if readable and kind in ("user", "team-user"):
        s_kind = "user" if kind == "user" else "team-user"
    return CompiledRule(
        uid=f"{GATE_PREFIX}{policy}/{name}", policy=policy, name=name, kind="budget",
        # An unreadable subject could cover anyone: the gate then covers everyone.
        subject=s_kind if readable else "team", team=team if readable else "*",
        user=user if readable else None, limit_micro_usd=0, window="day", hard_cap=True,
        failure_policy="FailClosed", admin_contact=reason)


def _gates(policy: str, doc: Any, problems: list[tuple[str, str]]) -> list[CompiledRule]:
    spec = doc.get("spec") if isinstance(doc, dict) else None
    rules = spec.get("rules") if isinstance(spec, dict) else None
    first = f"{problems[0][0]}: {problems[0][1]}" if problems else "rejected"
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if kind == "RoutingPolicy":
        return []  # the config file's routing stays: nothing to refuse
    if kind == "GuardrailPolicy":
        # Guardrails a plane cannot apply fail closed for their subject (its text would
        # leave unscreened); an unreadable subject covers every team.
        subject = spec.get("subject") if isinstance(spec, dict) else None
        team = _name(subject.get("team")) if isinstance(subject, dict) else None
        return [_gate(policy, 0, {"name": "guardrails",
                                  "subject": {"kind": "team", "team": team}}, first)]
    if not isinstance(rules, list):
        return [_gate(policy, 0, {}, first)]
    return [_gate(policy, i, r if isinstance(r, dict) else {}, first)
            for i, r in enumerate(rules)
            if not (isinstance(r, dict) and r.get("failurePolicy") == "FailOpen")]


def gate_message(rule: CompiledRule) -> str:
    return (f"rule {rule.policy}/{rule.name} is FailClosed and this data plane cannot "
            f"enforce it (its document is rejected: {rule.admin_contact}); the requests "
            "it applies to are refused until the document or this build changes")


def apply_documents(documents: Mapping[str, Any], *, namespace: str, generation: int,
                    fingerprint: str,
                    deployments: Mapping[str, Sequence[str]] | None = None) -> AppliedPolicy:
    """Apply each document on its own: the enforceable ones, the rejections, the gates.

    ``deployments`` (this plane's models → their deployments' routing names), when
    given, rejects a RoutingPolicy naming a model or deployment the plane does not have
    (its routing stays the config file's)."""
    rules: list[CompiledRule] = []
    routing: list[CompiledRouting] = []
    guardrails: list[CompiledGuardrails] = []
    rejections: list[Rejection] = []
    gates: list[CompiledRule] = []
    uids: set[str] = set()
    for name in sorted(documents):
        doc = documents[name]
        problems = _problems(doc)
        compiled: tuple[CompiledRule, ...] = ()
        routes: tuple[CompiledRouting, ...] = ()
        guards: tuple[CompiledGuardrails, ...] = ()
        if not problems:
            try:
                compiled, routes, guards = compile_all([doc])
            except PolicyInvalid as exc:
                problems = exc.problems
        if deployments is not None and routes:
            problems = [("spec.models", m) for _, m in routing_problems(routes, deployments)]
        taken = {r.model for r in routing} & {r.model for r in routes}
        if taken:
            problems = [("spec.models", f"model {sorted(taken)[0]!r} is also routed by "
                                        "another applied document")]
        if {g.team for g in guardrails} & {g.team for g in guards}:
            problems = [("spec.subject", "its subject already has an applied guardrail "
                                         "document")]
        dup = sorted({r.uid for r in compiled} & uids)
        if dup:
            problems = [("spec.rules", f"rule uid {dup[0]!r} is also used by another "
                                       "applied document")]
        if problems:
            rejections.append(Rejection(name=name, problems=[
                Problem(path=p, message=m) for p, m in problems]))
            gates += _gates(name, doc, problems)
            continue
        rules += compiled
        routing += routes
        guardrails += guards
        uids |= {r.uid for r in compiled}
    managed = {r.uid: ManagedRule(uid=r.uid, fail_open=r.failure_policy == "FailOpen",
                                  hard=r.hard_cap)
               for r in rules if r.kind == "budget" and not r.unlimited}
    # One gate per uid: two charges on one counter would be refused as a planner bug.
    unique = list({g.uid: g for g in gates}.values())
    managed |= {g.uid: ManagedRule(uid=g.uid, gate=gate_message(g)) for g in unique}
    snapshot = PolicySnapshot(namespace=namespace, generation=generation,
                              fingerprint=fingerprint, rules=(*rules, *unique),
                              routing=tuple(routing), guardrails=tuple(guardrails))
    return AppliedPolicy(snapshot=snapshot, rejections=tuple(rejections), managed=managed)
